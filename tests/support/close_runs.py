"""One run with ``--close-processes`` (bounded, or a replay with ``"config": {"replay":
true}``), in a fresh interpreter (``python -m support.close_runs SETTINGS``): a test process
may hold gRPC threads from earlier tests, and a fork of it may then crash (the helpers'
documented fallback, which these runs must not depend on). Prints one JSON line: each output
file's SHA-256 by kind and name (a replay's job token in the name as ``TOKEN``), the Beam
counters (a bounded run's), the sizes of the batches sent to helpers and of those returned
undone, and the helpers' failures.

SETTINGS (JSON): ``input``, ``output``, ``processes``; optional ``contracts`` (a path; the
bundled ones by default), ``config`` (more
``RunConfig`` fields), ``batch`` (``_BATCH_JOINS``, ``_BATCH_BYTES``, ``_SENT_BYTES``
overrides), ``chunk`` (``CHUNK_MESSAGES``, ``CHUNK_BYTES`` overrides: the read's chunks, which
the key step's helpers take) and ``fail`` (``{"die_on": n, "raise_on": n}``: a close step's
helper exits on its n-th batch, or raises on it; each helper counts its own batches;
``"step": "key"``: a key step's helper, on its n-th chunk; ``"step": "replay"``: a split
replay's helper of partition n, once its partition's job has ended).

``sent`` and ``undone`` are the close step's batches (their joins), ``chunks`` and
``chunks_undone`` the key step's chunks (their messages), ``parts`` and ``parts_undone`` a
split replay's partitions; ``ends_at_finalize``: how many helpers were alive each time the
writes' finalize began (a shard of an output).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from apache_beam.metrics.metric import MetricsFilter

from fanin.fleet.simulate import CONTRACTS_PATH
from fanin.pipelines.pipeline import RunConfig, run_pipeline
from fanin.pipelines.split_replay import SplitReplay
from fanin.transforms import forked_helpers, read, write
from fanin.transforms.forked_helpers import Helpers
from fanin.transforms.join_bounded import CloseGroups
from fanin.transforms.parse import _KeyFn

KINDS = ("closes", "late", "dead_letter")


def _kind(batch: Any) -> str:
    """Which step a batch sent to helpers is of: a split replay's (a partition number), the
    key step's (messages: bytes first) or the close step's."""
    if isinstance(batch, int):
        return "parts"
    return "chunks" if isinstance(batch[0][0], bytes) else "sent"


def _size(batch: Any) -> int:
    return batch if isinstance(batch, int) else len(batch)


_UNDONE = {"parts": "parts_undone", "chunks": "chunks_undone", "sent": "undone"}


def _spied() -> dict[str, list[Any]]:
    """Record what ``Helpers`` sends and gets back (the real methods run)."""
    seen: dict[str, list[Any]] = {"sent": [], "undone": [], "chunks": [], "chunks_undone": [],
                                  "parts": [], "parts_undone": [], "failures": [],
                                  "ends_at_finalize": []}
    submit, finished = Helpers.submit, Helpers.finished

    def counted(self: Helpers[Any, Any], batch: Any, keep: Any = None) -> None:
        seen[_kind(batch)].append(_size(batch))
        submit(self, batch, keep)

    def answered(self: Helpers[Any, Any], wait: bool = False) -> Any:
        done = finished(self, wait)
        for _, batch, result in done:
            if result is None:
                seen[_UNDONE[_kind(batch)]].append(_size(batch))
        seen["failures"].extend(self.failures)
        return done

    Helpers.submit = counted  # type: ignore[method-assign]
    Helpers.finished = answered  # type: ignore[method-assign]
    finalize = write._Finalize.process

    def finalized(self: write._Finalize, element: Any) -> Any:  # helpers alive at this point
        seen["ends_at_finalize"].append(len(forked_helpers._PARENT_ENDS))
        return finalize(self, element)

    write._Finalize.process = finalized  # type: ignore[method-assign]
    return seen


_FAILING = {"key": (_KeyFn, "keyed_chunk"), "close": (CloseGroups, "_decided"),
            "replay": (SplitReplay, "_part_in_helper")}


def _failing(die_on: int | None, raise_on: int | None, step: str = "close") -> None:
    owner, name = _FAILING[step]
    work = getattr(owner, name)
    calls: list[int] = []

    def failing(self: Any, batch: Any) -> Any:
        # a split replay's helper fails once its partition's job has spilled its files
        done = work(self, batch) if step == "replay" else None
        if os.getpid() != parent:  # a helper (the step itself does failed batches again)
            calls.append(1)  # in the helper's copy of this list: its own count
            count = batch if step == "replay" else len(calls)  # a partition: its number
            if count == die_on:
                os._exit(9)
            if count == raise_on:
                raise MemoryError("injected")
        return done if step == "replay" else work(self, batch)

    parent = os.getpid()
    setattr(owner, name, failing)


def main(settings: dict[str, Any]) -> dict[str, Any]:
    for name, value in settings.get("batch", {}).items():
        setattr(CloseGroups, name, value)
    for name, value in settings.get("chunk", {}).items():
        setattr(read, name, value)
    if "fail" in settings:
        fail = settings["fail"]
        _failing(fail.get("die_on"), fail.get("raise_on"), fail.get("step", "close"))
    seen = _spied()
    out = Path(settings["output"])
    config = RunConfig(output=str(out), inputs=[settings["input"]],
                       contracts_path=settings.get("contracts", CONTRACTS_PATH),
                       close_processes=settings["processes"], **settings.get("config", {}))
    result = run_pipeline(config, [] if config.replay else ["--runner=FnApiRunner"])
    files = {kind: {re.sub(r"-[0-9a-f]{12}-p", "-TOKEN-p", p.relative_to(out / kind).as_posix()):
                    hashlib.sha256(p.read_bytes()).hexdigest()
                    for p in sorted((out / kind).rglob("*")) if p.is_file()} for kind in KINDS}
    counters = {}
    if not config.replay:  # a split replay's result is its first process's job
        found = result.metrics().query(MetricsFilter().with_namespace("fanin"))
        counters = {r.key.metric.name: r.committed for r in found["counters"]}
    return {"files": files, "counters": counters, **seen}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
