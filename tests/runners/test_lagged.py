"""Lagged replays on the portable runners against the executable reference (docs/spec.md §4).

Input sorted by event time (the bounded order: opens first, then the text) is replayed with a
disorder allowance, so the watermark trails the event times and a join's next messages (after
its close, after a full bag, after its tombstone's end) reach the join before the runner fires
the timers that settle it. With the watermark trigger the stream must then give the bounded
result whatever the lag: Prism and Flink ``[local]`` must give the reference's closes, late
lines and dead letters, join by join. The inputs are the spec suite's generated joins
(``tests/spec/joins.py``), its join of three rounds inside a 30 s lag (``J28``) and a straggler
after a tombstone; the reference (``tests/spec/reference.py``) shares no join code with Fanin.

At a per-join limit the join keeps the first messages in the order they *arrive*; a Flink job
of parallelism 2 runs the replay's steps on two subtasks, which interleave a join's lines, so
there only the invariants hold (docs/spec.md §4); with parallelism 1 the lines arrive in file
order and the outputs are the reference's.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from spec.invariants import check_run, read_output_dir
from spec.joins import CONTRACTS_YAML, J28, RandomDraw, batch_lines
from spec.reference import Env
from spec.runs import arrival_order, assert_same

from fanin.cli import main
from tests.runners.parity import FLINK_LOCAL

pytestmark = pytest.mark.runner

PRISM = ("--runner=PrismRunner",)
FLINK_ONE = (*FLINK_LOCAL[:-1], "--parallelism=1")
STRAGGLER = ['{"kind": "open", "join_id": "s", "opened_at": "2026-01-01T00:00:00Z", '
             '"contract": "c6"}',  # c6: D at 00:10, the tombstone ends at 00:15
             '{"join_id": "s", "branch": "a", "status": "ok", "contract": "c6", '
             '"event_time": "2026-01-01T00:00:20Z"}']
GENERATED_JOINS = 25  # j0..j24: none is J28's join


def _env(limit: int | None) -> Env:
    return Env(CONTRACTS_YAML, max_messages_per_join=100_000 if limit is None else limit)


def _lagged_replay(runner: tuple[str, ...], folder: Path, limit: int | None, lag_s: float
                   ) -> tuple[list[str], dict[str, list[dict[str, Any]]]]:
    """The sorted lines and the outputs of their replay with ``lag_s`` on ``runner``."""
    generated = batch_lines(RandomDraw(random.Random(28)), GENERATED_JOINS)
    lines = arrival_order(generated + J28 + STRAGGLER, _env(limit))
    folder.mkdir()
    data, contracts = folder / "input.jsonl", folder / "contracts.yaml"
    data.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    contracts.write_text(CONTRACTS_YAML, encoding="utf-8")
    args = ["run", "--input", str(data), "--contracts", str(contracts), "--output",
            str(folder / "out"), "--replay", "--close-trigger", "watermark",
            f"--max-disorder-s={lag_s}", *runner]
    if limit is not None:
        args.append(f"--max-messages-per-join={limit}")
    assert main(args) == 0, args
    return lines, read_output_dir(folder / "out")


def test_lagged_replay_on_prism_equals_reference(prism: str, tmp_path: Path) -> None:
    for name, limit, lag_s in (("plain", None, 5.0), ("limit", 2, 30.0)):
        lines, outputs = _lagged_replay(PRISM, tmp_path / name, limit, lag_s)
        assert_same(lines, _env(limit), {f"Prism, {name}": outputs})


def test_lagged_replay_on_flink_equals_reference(flink_jar: str, tmp_path: Path) -> None:
    lines, outputs = _lagged_replay(FLINK_LOCAL, tmp_path / "plain", None, 5.0)
    assert_same(lines, _env(None), {"Flink, parallelism 2": outputs})
    lines, outputs = _lagged_replay(FLINK_ONE, tmp_path / "limit", 2, 30.0)
    assert_same(lines, _env(2), {"Flink, parallelism 1, limit 2": outputs})
    lines, outputs = _lagged_replay(FLINK_LOCAL, tmp_path / "parallel", 2, 30.0)
    check_run(lines, outputs)  # every message in exactly one output, closes well formed
