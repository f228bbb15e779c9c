"""One set of input lines through each implementation: the reference, the core, the bounded
pipeline (FnApiRunner) and the watermark replay; outputs compared per join.

Each runner returns the three outputs as lists of JSON objects (dead letters as written; the
comparison keeps their ``error`` and ``raw`` only).
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog, JoinDefaults, parse_contracts
from fanin.contracts.parsing import parse_message
from fanin.core.bounded import bounded_outputs
from fanin.pipelines.pipeline import RunConfig, run_pipeline
from spec.invariants import KINDS, check_run, read_output_dir
from spec.reference import Env, parse_lines, reference_outputs

__all__ = ["arrival_order", "assert_same", "bounded_run", "by_join", "core_run", "replay_run"]

Outputs = dict[str, list[dict[str, Any]]]


def arrival_order(lines: list[str], env: Env) -> list[str]:
    """The lines sorted as the reference's event-time order (event time, opens first, text);
    invalid lines keep their place at the front."""
    by_join, _ = parse_lines(lines, env)
    msgs = sorted((m for ms in by_join.values() for m in ms),
                  key=lambda m: (m.time, m.kind != "open", m.raw))
    valid = {m.line for m in msgs}
    return [line for n, line in enumerate(lines, 1) if n not in valid] + [m.raw for m in msgs]


def core_run(lines: list[str], env: Env) -> Outputs:
    """The bounded decision core alone: valid records grouped by join, decided per join with
    the per-join limits (``fanin.core.bounded``)."""
    catalog = Catalog(parse_contracts(env.contracts_yaml), _defaults(env))
    groups: dict[str, list[Any]] = defaultdict(list)
    found: Outputs = {kind: [] for kind in KINDS}
    for number, line in enumerate(lines, start=1):
        record, dead = parse_message(line, ("input", number), catalog.contracts, env.max_bytes)
        if dead is not None:
            found["dead_letter"].append(dead)
        else:
            groups[record[R.JOIN_ID]].append(record)
    for records in groups.values():
        for kind, obj in bounded_outputs(records, catalog, env.max_messages_per_join,
                                         env.max_bytes_per_join):
            found[kind].append(obj)
    return found


def _defaults(env: Env, **changes: Any) -> JoinDefaults:
    """The pipeline's defaults for the reference's (``Env.defaults``), with ``changes``."""
    return JoinDefaults(**{**dataclasses.asdict(env.defaults), **changes})


def _write_inputs(lines: list[str], folder: Path, contracts_yaml: str) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    data, contracts = folder / "input.jsonl", folder / "contracts.yaml"
    data.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    contracts.write_text(contracts_yaml, encoding="utf-8")
    return data, contracts


def bounded_run(lines: list[str], folder: Path, contracts_yaml: str, env: Env,
                close_processes: int | None = None) -> Outputs:
    """``fanin run`` on a file (FnApiRunner), with ``--close-processes`` if given."""
    data, contracts = _write_inputs(lines, folder, contracts_yaml)
    run_pipeline(RunConfig(output=str(folder / "out"), inputs=[str(data)],
                           contracts_path=str(contracts), defaults=_defaults(env),
                           max_messages_per_join=env.max_messages_per_join,
                           max_bytes=env.max_bytes,
                           max_bytes_per_join=env.max_bytes_per_join,
                           close_processes=close_processes), [])
    return read_output_dir(folder / "out")


def replay_run(lines: list[str], folder: Path, contracts_yaml: str, env: Env,
               trigger: str = "watermark", max_disorder_s: float | None = None,
               close_processes: int | None = None) -> Outputs:
    """``fanin run --replay --close-trigger <trigger>`` on the lines sorted by event time, or,
    with ``max_disorder_s``, in their given order with that watermark lag; split across
    ``close_processes`` processes (default: as ``fanin run``)."""
    ordered = arrival_order(lines, env) if max_disorder_s is None else lines
    data, contracts = _write_inputs(ordered, folder, contracts_yaml)
    defaults = _defaults(env, close_trigger=trigger)
    run_pipeline(RunConfig(output=str(folder / "out"), inputs=[str(data)], replay=True,
                           max_disorder_s=max_disorder_s or 0.0,
                           contracts_path=str(contracts), defaults=defaults,
                           max_messages_per_join=env.max_messages_per_join,
                           max_bytes=env.max_bytes,
                           max_bytes_per_join=env.max_bytes_per_join,
                           close_processes=close_processes), [])
    return read_output_dir(folder / "out")


def _join_id(line: str) -> Any:
    """The ``join_id`` field of a line that is a JSON object (any value), else None."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return obj.get("join_id") if isinstance(obj, dict) else None


def by_join(outputs: Outputs) -> dict[str, dict[str, list[str]]]:
    """join id -> kind -> sorted canonical lines (dead letters as ``{error, raw}``)."""
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: {k: [] for k in KINDS})
    for close in outputs["closes"]:
        found[close["join_id"]]["closes"].append(json.dumps(close, sort_keys=True))
    for late in outputs["late"]:
        found[late["join_id"]]["late"].append(json.dumps(late, sort_keys=True))
    for dead in outputs["dead_letter"]:
        join_id = _join_id(dead["raw"])
        found[join_id]["dead_letter"].append(
            json.dumps({"error": dead["error"], "raw": dead["raw"]}, sort_keys=True))
    for kinds in found.values():
        for lines in kinds.values():
            lines.sort()
    return dict(found)


def _lines_of(join_id: str | None, lines: list[str]) -> list[str]:
    def owner(line: str) -> Any:
        return _join_id(line)
    return [line for line in lines if owner(line) == join_id]


def assert_same(lines: list[str], env: Env, found: dict[str, dict[str, list[Any]]]) -> None:
    """Every implementation in ``found`` gives the reference's outputs, join by join; on a
    difference, the smallest differing join's input and both outputs are shown."""
    expected = reference_outputs(lines, env)
    check_run(lines, expected)  # the oracle keeps the invariants itself
    want = by_join(expected)
    reports = []
    for name, outputs in found.items():
        got = by_join(outputs)
        differing = [j for j in sorted(set(want) | set(got), key=str)
                     if want.get(j) != got.get(j)]
        if differing:
            join_id = min(differing, key=lambda j: len(_lines_of(j, lines)))
            show = {kind: [json.loads(line) for line in objs]
                    for kind, objs in want.get(join_id, {}).items()}
            other = {kind: [json.loads(line) for line in objs]
                     for kind, objs in got.get(join_id, {}).items()}
            reports.append(
                f"{name} differs from the reference on {len(differing)} join(s); "
                f"join {join_id!r}, input:\n" + "\n".join(_lines_of(join_id, lines)) +
                f"\nreference: {json.dumps(show, indent=1)}\n{name}: "
                f"{json.dumps(other, indent=1)}")
    if reports:
        pytest.fail("\n\n".join(reports), pytrace=False)
