"""A streaming run never drops an output by lateness, whatever the event
times. The cases of the issue (each lost outputs with the ten-year allowed lateness of the old
event-time windowed write), replayed and compared with the bounded run of the same file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.reliability.runs import accounted, messages, run_cli, summary

OPEN = ('{"kind":"open","join_id":"j1","opened_at":"2026-01-01T00:00:00Z",'
        '"required":["a","b"],"deadline_s":60}')
RECEIPT = '{"join_id":"j1","branch":"a","status":"ok","event_time":"2026-01-01T00:00:01Z"}'
THREE = [OPEN, RECEIPT, "not json"]


def _same_as_bounded(lines: list[str], tmp_path: Path, *args: str) -> list[tuple]:
    bounded = run_cli(lines, tmp_path / "bounded", *args)
    replay = run_cli(lines, tmp_path / "replay", "--replay", "--max-disorder-s", "0", *args)
    assert accounted(replay) == accounted(bounded) == messages(lines)
    assert summary(replay) == summary(bounded)
    return summary(replay)


def test_retention_beyond_ten_years_keeps_the_close(tmp_path: Path) -> None:
    found = _same_as_bounded(THREE, tmp_path, "--retention-s", "400000000")
    assert found == [("closes", "j1", "timeout"), ("dead_letter", "not json", "invalid_json")]


@pytest.mark.parametrize("trigger", ["eager", "watermark"])
def test_an_open_with_a_huge_deadline_does_not_hide_the_others(tmp_path: Path,
                                                               trigger: str) -> None:
    lines = [*THREE, '{"kind":"open","join_id":"zz","deadline_s":1e9}']
    found = _same_as_bounded(lines, tmp_path, "--close-trigger", trigger)
    assert found == sorted([("closes", "j1", "timeout"),
                            ("dead_letter", lines[3], "invalid_message"),
                            ("dead_letter", "not json", "invalid_json")])


def test_a_receipt_eleven_years_later_keeps_the_earlier_close(tmp_path: Path) -> None:
    lines = [OPEN.replace('["a","b"]', '["a"]'), RECEIPT,
             '{"join_id":"later","branch":"a","status":"ok",'
             '"event_time":"2037-01-01T00:00:00Z"}']
    found = _same_as_bounded(lines, tmp_path, "--close-trigger", "watermark")
    assert found == [("closes", "j1", "complete"), ("dead_letter", lines[2], "undefined_join")]


def test_old_lines_after_new_ones_keep_their_dead_letters(tmp_path: Path) -> None:
    lines = [OPEN, RECEIPT,
             '{"join_id":"old","branch":"a","status":"ok","event_time":"2000-01-01T00:00:00Z"}',
             '{"join_id":"nan","branch":"a","status":"ok","event_time":"2000-01-01T00:00:00Z",'
             '"value":NaN}',
             '{"join_id":"old","branch":"a","status":"ok","event_time":"2000-01-01T00:00:01Z",'
             '"attempt":0}']
    found = _same_as_bounded(lines, tmp_path)
    assert found == sorted([("closes", "j1", "timeout"),
                            ("dead_letter", lines[2], "undefined_join"),
                            ("dead_letter", lines[3], "invalid_json"),
                            ("dead_letter", lines[4], "invalid_message")])


@pytest.mark.parametrize("refused", [
    # a readable event time on a message the parse refuses (a bad status, an unknown contract,
    # a repeated field name): it moved the replay's watermark to year 9999 and made every
    # message after it late
    '{"join_id":"x","branch":"a","status":"bogus","event_time":"9999-12-31T00:00:00Z"}',
    '{"join_id":"x","branch":"a","status":"ok","event_time":"9999-12-31T00:00:00Z",'
    '"contract":"nope"}',
    '{"join_id":"x","join_id":"y","branch":"a","status":"ok",'
    '"event_time":"9999-12-31T00:00:00Z"}',
])
def test_a_refused_message_with_a_far_time_moves_no_watermark(tmp_path: Path,
                                                               refused: str) -> None:
    receipt_b = RECEIPT.replace('"a"', '"b"')
    found = _same_as_bounded([refused, OPEN, RECEIPT, receipt_b], tmp_path)
    assert ("closes", "j1", "complete") in found
    assert not [kind for kind, *_ in found if kind == "late"]


def test_a_redelivery_at_the_closing_millisecond_after_an_eager_close_is_late(
        tmp_path: Path) -> None:
    """docs/spec.md §4: an eager close is final on arrival, so a message that arrives after
    it is late even at the close's own millisecond (a redelivery included), also in a replay
    of input sorted by event time; the watermark trigger gives the bounded result there."""
    receipt_b = RECEIPT.replace('"a"', '"b"').replace(":01Z", ":02Z")
    lines = [OPEN, RECEIPT, receipt_b, receipt_b]
    bounded = run_cli(lines, tmp_path / "bounded")
    watermark = run_cli(lines, tmp_path / "watermark", "--replay", "--close-trigger",
                        "watermark")
    eager = run_cli(lines, tmp_path / "eager", "--replay", "--close-trigger", "eager")
    assert watermark == bounded
    assert [c["counts"] for c in bounded["closes"]] == [
        {"messages": 4, "duplicates": 1, "superseded": 0}]
    assert [(c["reason"], c["closed_at"], c["counts"]) for c in eager["closes"]] == [
        ("complete", "2026-01-01T00:00:02.000Z",
         {"messages": 3, "duplicates": 0, "superseded": 0})]
    assert [(late["reason"], late["message"]) for late in eager["late"]] == [
        ("after_close", json.loads(receipt_b))]


def test_a_disorder_allowance_counts_its_milliseconds_as_written(tmp_path: Path) -> None:
    """``--max-disorder-s 1.001`` covers a line 1,001 ms behind the latest (docs/spec.md §2
    counts seconds in whole milliseconds of the number as written; ``1.001 * 1000`` is
    1,000.99...): the replay equals the bounded run."""
    lines = ['{"kind":"open","join_id":"j","opened_at":"2024-01-01T00:00:00Z",'
             '"required":["a"],"deadline_s":1}',
             '{"kind":"open","join_id":"k","opened_at":"2024-01-01T00:00:02.001Z",'
             '"required":["a"]}',
             '{"join_id":"j","branch":"a","status":"ok","event_time":"2024-01-01T00:00:01Z"}']
    args = ("--close-trigger", "watermark")
    bounded = run_cli(lines, tmp_path / "bounded", *args)
    replay = run_cli(lines, tmp_path / "replay", "--replay", "--max-disorder-s", "1.001", *args)
    assert replay == bounded
    assert [(c["join_id"], c["reason"]) for c in bounded["closes"]] == [
        ("j", "complete"), ("k", "timeout")]
