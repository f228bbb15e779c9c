"""The general guard: an exception raised by the core while folding, deciding or
encoding one join (a fault injected here) sends the messages that join holds to
``dead_letter`` as ``internal_error`` and the run goes on: the other joins close, nothing is
lost, the bounded run's counter ``dead_letter.internal_error`` counts them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from apache_beam.metrics.metric import MetricsFilter

from fanin.contracts import records as R
from fanin.contracts.catalog import JoinDefaults
from fanin.core import bounded, reducer
from fanin.pipelines.pipeline import RunConfig, run_pipeline
from fanin.transforms import join_streaming
from tests.reliability.runs import accounted, messages, read_jsonl, write_lines

LINES = [
    '{"kind":"open","join_id":"poison","opened_at":"2026-01-01T00:00:00Z","required":["a"]}',
    '{"join_id":"poison","branch":"a","status":"ok","event_time":"2026-01-01T00:00:01Z",'
    '"value":"secret"}',
    '{"kind":"open","join_id":"fine","opened_at":"2026-01-01T00:00:00Z","required":["a"]}',
    '{"join_id":"fine","branch":"a","status":"ok","event_time":"2026-01-01T00:00:02Z"}',
    '{"join_id":"poison","branch":"a","status":"ok","event_time":"2026-01-01T00:00:03Z"}',
]


class Injected(RuntimeError):
    """The fault."""


def _poisoned(records: Any) -> bool:
    if isinstance(records, tuple):  # one record
        records = [records]
    return any(r[R.JOIN_ID] == "poison" for r in records)


def _fault(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the core raise for the join ``poison``: folding, deciding or encoding."""
    if where == "fold":
        real_add = reducer.JoinReducer.add

        def add(self: Any, record: Any) -> Any:
            if _poisoned(record):
                raise Injected("fold failed")
            return real_add(self, record)

        monkeypatch.setattr(reducer.JoinReducer, "add", add)
    elif where == "decide":
        real_decide = join_streaming.decide

        def decide(records: Any, *args: Any) -> Any:
            if _poisoned(records):
                raise Injected("decide failed")
            return real_decide(records, *args)

        monkeypatch.setattr(join_streaming, "decide", decide)  # the streaming join
        monkeypatch.setattr(bounded, "decide", decide)  # the bounded plan
    else:
        real_outputs = join_streaming.closed_outputs

        def closed_outputs(outcome: Any) -> Any:
            if outcome.close["join_id"] == "poison":
                raise Injected("encode failed")
            return real_outputs(outcome)

        monkeypatch.setattr(join_streaming, "closed_outputs", closed_outputs)
        monkeypatch.setattr(bounded, "closed_outputs", closed_outputs)


@pytest.mark.parametrize("where", ["fold", "decide", "encode"])
@pytest.mark.parametrize("mode", ["bounded", "eager", "watermark"])
def test_a_failing_join_goes_to_dead_letter_and_the_run_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, mode: str) -> None:
    _fault(where, monkeypatch)
    traffic = write_lines(tmp_path / "in.jsonl", LINES)
    out = tmp_path / "out"
    trigger = "watermark" if mode == "watermark" else "eager"
    result = run_pipeline(RunConfig(output=str(out), inputs=[str(traffic)],
                                    replay=mode != "bounded",
                                    defaults=JoinDefaults(close_trigger=trigger)), [])
    found = read_jsonl(out)
    assert [c["join_id"] for c in found["closes"]] == ["fine"]
    dead = found["dead_letter"]
    assert sorted(d["raw"] for d in dead) == sorted(line for line in LINES if "poison" in line)
    internal = [d for d in dead if d["error"] == "internal_error"]
    assert {d["detail"] for d in internal} == {f"Injected: {where} failed"}
    assert all("secret" not in d["detail"] for d in dead)
    if mode != "eager" or where != "encode":
        # a watermark replay of sorted input moves the watermark only where a timer changes
        # what a message does (fanin.transforms.replay): the join is decided when its timer
        # fires, its last receipt already held, as in the bounded run
        assert internal == dead
    else:  # the eager join failed when it closed; the receipt after that starts a new,
        # undefined join (the poisoned join's state is dropped)
        assert [d["error"] for d in dead if d not in internal] == ["undefined_join"]
    assert accounted(found) == messages(LINES)
    if mode == "bounded":  # the streaming local runner does not report counters reliably
        counters = result.metrics().query(MetricsFilter().with_name(
            "dead_letter.internal_error"))["counters"]
        assert sum(c.committed for c in counters) == len(dead)
