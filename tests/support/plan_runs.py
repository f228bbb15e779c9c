"""A replay's plan made with ``processes`` (its lines parsed with helpers), in a fresh
interpreter (``python -m support.plan_runs SETTINGS``; a test process's gRPC threads can make a
fork of it crash, the helpers' fallback these runs must not depend on). Prints one JSON line:
the SHA-256 of the plan (each partition's stream events and the plan's parse of its lines),
its event count, the chunks sent to helpers and those returned undone, and what failed.

SETTINGS (JSON): ``input``, ``processes``, ``partitions``; optional ``chunk``
(``CHUNK_MESSAGES`` of the read's chunks, which the plan takes), ``max_bytes``,
``max_disorder_s`` and ``raise_on`` (a helper raises on its n-th chunk).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from typing import Any

from fanin.fleet.simulate import CONTRACTS_PATH
from fanin.pipelines.pipeline import RunConfig, catalog_for, replay_of
from fanin.transforms import read, replay
from fanin.transforms.forked_helpers import Helpers
from fanin.transforms.read import numbered_lines


def _events(stream: Any) -> list[Any]:
    return [[tv.value for tv in event.timestamped_values] if hasattr(event, "timestamped_values")
            else event.new_watermark.micros for event in stream._events]


def main(settings: dict[str, Any]) -> dict[str, Any]:
    seen: dict[str, Any] = {"chunks": 0, "undone": 0, "failures": []}
    submit, finished = Helpers.submit, Helpers.finished

    def counted(self: Helpers[Any, Any], batch: Any, keep: Any = None) -> None:
        seen["chunks"] += 1
        submit(self, batch, keep)

    def answered(self: Helpers[Any, Any], wait: bool = False) -> Any:
        done = finished(self, wait)
        seen["undone"] += sum(result is None for *_, result in done)
        return done

    Helpers.submit = counted  # type: ignore[method-assign]
    Helpers.finished = answered  # type: ignore[method-assign]
    read.CHUNK_MESSAGES = settings.get("chunk", read.CHUNK_MESSAGES)
    if "raise_on" in settings:
        parent, calls, work = os.getpid(), [], replay._scan_chunk

        def failing(scan: Any, chunk: Any) -> Any:
            if os.getpid() != parent:
                calls.append(1)
                if len(calls) == settings["raise_on"]:
                    raise MemoryError("injected")
            return work(scan, chunk)

        replay._scan_chunk = failing
    logging.getLogger("fanin").addHandler(_Failures(seen["failures"]))
    max_bytes = settings.get("max_bytes", 262_144)
    config = RunConfig(output="o", inputs=[settings["input"]], contracts_path=CONTRACTS_PATH,
                       replay=True, max_bytes=max_bytes)
    plan = replay_of(numbered_lines(settings["input"], max_bytes), catalog_for(config),
                     settings.get("max_disorder_s", 0.0), max_bytes,
                     partitions=settings["partitions"], processes=settings["processes"])
    digest = hashlib.sha256()
    for stream, token in zip(plan._streams, plan._tokens, strict=True):
        digest.update(repr(_events(stream)).encode())
        digest.update(repr(sorted(replay._PARSED[token].items())).encode())
    return {"plan": digest.hexdigest(), "events": plan.events, **seen}


class _Failures(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.WARNING)
        self._into = into

    def emit(self, record: logging.LogRecord) -> None:
        self._into.append(record.getMessage())


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
