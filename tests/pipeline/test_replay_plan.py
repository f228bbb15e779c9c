"""The replay's watermark plan (fanin.transforms.replay): the watermark moves before a line
only where a timer of that line's join may change what the line does; the lines are read from
the file in the worker; outputs of a replay follow docs/spec.md §4 (behaviour under the plan)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import ElementEvent, WatermarkEvent

from fanin.contracts.catalog import JoinDefaults
from fanin.contracts.timefmt import parse_rfc3339
from fanin.pipelines.pipeline import RunConfig, run_pipeline
from fanin.transforms.read import numbered_lines
from fanin.transforms.replay import Replay
from tests.reliability.runs import read_jsonl, write_lines

T0 = parse_rfc3339("2026-01-01T00:00:00Z")
DAY_MS = 86_400_000


def _at(seconds: float) -> str:
    return f"2026-01-01T00:{int(seconds) // 60:02d}:{seconds % 60:06.3f}Z"


def _open(join_id: str, seconds: float, deadline_s: float = 10) -> str:
    return json.dumps({"kind": "open", "join_id": join_id, "opened_at": _at(seconds),
                       "required": ["a"], "deadline_s": deadline_s})


def _receipt(join_id: str, seconds: float, branch: str = "a") -> str:
    return json.dumps({"join_id": join_id, "branch": branch, "status": "ok",
                       "event_time": _at(seconds)})


def _plan(path: Path, **kwargs: Any) -> list[tuple[str, Any]]:
    """The stream's events: ("lines", number of lines) or ("watermark", seconds after T0)."""
    replay = Replay(numbered_lines(str(path)), kwargs.pop("max_disorder_s", 0.0),
                    kwargs.pop("horizon_ms", DAY_MS), **kwargs)
    events: list[tuple[str, Any]] = []
    for event in replay._stream._events:  # the TestStream's plan, as built
        if isinstance(event, ElementEvent):
            count = sum(len(tv.value[1][1]) // 8 for tv in event.timestamped_values)
            events.append(("lines", count))
        elif isinstance(event, WatermarkEvent):
            events.append(("watermark", (event.new_watermark.micros // 1000 - T0) / 1000))
    return events


def test_sorted_input_moves_the_watermark_only_at_the_end(tmp_path: Path) -> None:
    lines = [line for i in range(50) for line in
             (_open(f"j{i}", i), _receipt(f"j{i}", i + 0.5))]
    path = write_lines(tmp_path / "in.jsonl", lines)
    events = _plan(path, retention_floor_ms=DAY_MS)
    assert events[0] == ("lines", 100)
    assert [kind for kind, _ in events[1:]] == ["watermark"] * 2  # the final one, +infinity
    assert events[1][1] > 49.5 + 10  # past every deadline


def test_a_line_behind_the_bound_waits_for_the_watermark(tmp_path: Path) -> None:
    lines = [_open("x", 0), _open("y", 30), _receipt("x", 5), _receipt("y", 31)]
    path = write_lines(tmp_path / "in.jsonl", lines)
    events = _plan(path, retention_floor_ms=DAY_MS)
    # x's receipt (5 s) is behind the bound (30 s): the watermark moves to 30 s before it
    assert events[:3] == [("lines", 2), ("watermark", 30.0), ("lines", 2)]
    # with 30 s of allowed disorder nothing is behind
    assert _plan(path, retention_floor_ms=DAY_MS, max_disorder_s=30.0)[0] == ("lines", 4)


def test_a_join_whose_tombstone_may_have_expired_moves_the_watermark(tmp_path: Path) -> None:
    lines = [_open("s", 0), _receipt("s", 1), _open("t", 40), _receipt("s", 50)]
    path = write_lines(tmp_path / "in.jsonl", lines)
    # retention 30 s: s's tombstone may expire from 0 + 30 s on, so the watermark moves to
    # 50 s before s's straggler; t's open (40 s) has no earlier line and moves nothing
    assert _plan(path, retention_floor_ms=30_000)[:3] == \
        [("lines", 3), ("watermark", 50.0), ("lines", 1)]
    # retention 60 s: it cannot have expired by 50 s
    assert _plan(path, retention_floor_ms=60_000)[0] == ("lines", 4)


def test_the_watermark_moves_at_the_latest_every_batch_lines(tmp_path: Path) -> None:
    lines = [_open(f"j{i}", i) for i in range(10)]
    path = write_lines(tmp_path / "in.jsonl", lines)
    events = _plan(path, retention_floor_ms=DAY_MS, batch=4)
    assert events[:4] == [("lines", 4), ("watermark", 4.0), ("lines", 4), ("watermark", 8.0)]


@pytest.mark.parametrize("trigger", ["watermark", "eager"])
def test_a_replay_with_few_advances_gives_the_bounded_outputs(tmp_path: Path,
                                                              trigger: str) -> None:
    """Sorted input, watermark moved only at the end: closes, late lines and dead letters
    equal the bounded run's (docs/spec.md §4), including a straggler after its tombstone."""
    lines = [_open("a", 0), _receipt("a", 2), _open("b", 1), _receipt("b", 3, "z"),
             _receipt("a", 20), "not json", _receipt("u", 21), _open("b", 40)]
    path = write_lines(tmp_path / "in.jsonl", lines)
    found = {}
    for replay in (False, True):
        out = tmp_path / f"out-{replay}"
        run_pipeline(RunConfig(output=str(out), inputs=[str(path)], replay=replay,
                               defaults=JoinDefaults(close_trigger=trigger, retention_s=15)),
                     [])
        found[replay] = {kind: sorted(json.dumps(o, sort_keys=True) for o in objs)
                         for kind, objs in read_jsonl(out).items()}
    assert found[True] == found[False]
    assert len(found[True]["closes"]) == 3  # b's straggler at 40 s started a fresh join


def test_a_file_changed_while_replayed_fails_the_run(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "in.jsonl", [_open("a", 0), _receipt("a", 1)])
    replay = Replay(numbered_lines(str(path)), 0.0, DAY_MS)
    write_lines(path, [_open("a", 0)])
    with pytest.raises(Exception, match="changed while it was replayed"), beam.Pipeline(
            options=PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])) as p:
        _ = p | replay
