"""The replay's watermark plan (fanin.transforms.replay): the watermark moves before a line
only where a timer of that line's join may change what the line does; the worker takes the
plan's parse of each line, or reads and parses the file in another process; outputs of a
replay follow docs/spec.md §4 (behaviour under the plan)."""

from __future__ import annotations

import gc
import json
import re
import resource
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import ElementEvent, TestStream, WatermarkEvent
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from support.builders import make_catalog, open_msg, receipt

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog, JoinDefaults, parse_contracts
from fanin.contracts.parsing import DEFAULT_MAX_BYTES
from fanin.contracts.timefmt import format_ms, parse_rfc3339
from fanin.core.outcomes import CLOSES, DEAD_LETTER, LATE
from fanin.pipelines.pipeline import RunConfig, _deadline_floor_ms, run_pipeline
from fanin.transforms import replay as replay_module
from fanin.transforms.join_streaming import JoinDoFn
from fanin.transforms.parse import ParseMessages
from fanin.transforms.read import numbered_lines
from fanin.transforms.replay import MessageScan, Replay, by_event_time, covering_disorder_s
from tests.reliability.runs import read_jsonl, write_lines

T0 = parse_rfc3339("2026-01-01T00:00:00Z")
DAY_MS = 86_400_000
SCAN = MessageScan(frozenset(), DEFAULT_MAX_BYTES)  # the lines here name no contract


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
                    kwargs.pop("horizon_ms", DAY_MS), SCAN, **kwargs)
    events: list[tuple[str, Any]] = []
    for event in replay._streams[0]._events:  # the TestStream's plan, as built
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


def _two_branches(join_id: str, seconds: float) -> str:
    return json.dumps({"kind": "open", "join_id": join_id, "opened_at": _at(seconds),
                       "required": ["a", "b"], "deadline_s": 10})


# x moves the watermark to 15 s; j's open (0 s, D 10 s) arrives behind it, then two receipts
BEHIND = [json.dumps({"kind": "open", "join_id": "x", "opened_at": _at(15), "required": []}),
          _two_branches("j", 0), _receipt("j", 1), _receipt("j", 2, "b")]


def _time(line: str) -> str:
    obj = json.loads(line)
    return str(obj.get("event_time") or obj["opened_at"])


def test_a_line_behind_the_watermark_ends_its_event(tmp_path: Path) -> None:
    """A line behind the watermark may set a timer already due (its join decided at once);
    the next line of its join comes in the next event, which the local runner reads only once
    that timer has fired. Other joins' lines share the event."""
    path = write_lines(tmp_path / "in.jsonl", [*BEHIND[:2], _open("y", 15), *BEHIND[2:]])
    # j's open and y's open; j's receipt at 1 s (behind as well); j's receipt at 2 s
    assert [kind_count for kind_count in _plan(path, retention_floor_ms=DAY_MS)
            if kind_count[0] == "lines"] == [("lines", 1), ("lines", 2), ("lines", 1),
                                             ("lines", 1)]
    # sorted, nothing is behind: one event
    assert _plan(write_lines(tmp_path / "sorted.jsonl", sorted(BEHIND[1:], key=_time)),
                 retention_floor_ms=DAY_MS)[0] == ("lines", 3)


@pytest.mark.parametrize("trigger", ["watermark", "eager"])
def test_messages_behind_the_watermark_meet_a_decided_join(tmp_path: Path, trigger: str) -> None:
    """docs/spec.md §4: a join whose messages are all behind the watermark is decided at its
    deadline by what has arrived when its timer fires, and later ones are late. j's open
    arrives with the watermark at 15 s, past its D (10 s): it closes as a timeout holding the
    open alone, and its receipts (1 s, 2 s) are late, as they are when another join's line
    comes between them (they were in j's close: the timer had not fired yet)."""
    path = write_lines(tmp_path / "in.jsonl", BEHIND)
    run_pipeline(RunConfig(output=str(tmp_path / "out"), inputs=[str(path)], replay=True,
                           defaults=JoinDefaults(close_trigger=trigger)), [])
    found = read_jsonl(tmp_path / "out")
    closes = {c["join_id"]: c for c in found[CLOSES]}
    assert (closes["j"]["reason"], closes["j"]["closed_at"], closes["j"]["counts"]["messages"]) \
        == ("timeout", _at(10), 1)
    assert sorted((late["reason"], late["message"]["event_time"]) for late in found[LATE]) == \
        [("after_close", _at(1)), ("after_close", _at(2))]
    assert not found[DEAD_LETTER]


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


def test_the_watermark_moves_every_batch_lines_only_once_a_deadline_may_have_passed(
        tmp_path: Path) -> None:
    """Joins that stay open across the input (deadlines longer than it) are held whatever the
    watermark does there: each advance only made every one of them pay the local runner
    again. The watermark then moves every 4 x batch lines."""
    long = write_lines(tmp_path / "long.jsonl", [_open(f"j{i}", i, 3600) for i in range(20)])
    assert _plan(long, retention_floor_ms=DAY_MS, batch=4, deadline_floor_ms=DAY_MS)[:3] == \
        [("lines", 16), ("watermark", 16.0), ("lines", 4)]
    # an open's own deadline_s lowers the floor: from 2 s on, the first join's may have passed
    short = write_lines(tmp_path / "short.jsonl", [_open(f"j{i}", i, 2) for i in range(20)])
    assert _plan(short, retention_floor_ms=DAY_MS, batch=4, deadline_floor_ms=DAY_MS)[:4] == \
        [("lines", 4), ("watermark", 4.0), ("lines", 4), ("watermark", 8.0)]
    # a deadline the watermark passed does not count again: with a floor of 2 s, j0-j2's
    # (2-4 s) pass at 4 s, j3's (5 s) at 8 s; the joins' later lines move it no more
    lines = [_open(f"j{i}", i, 3600) for i in range(4)] + [
        _receipt(f"j{i % 4}", i) for i in range(4, 20)]
    again = write_lines(tmp_path / "again.jsonl", lines)
    events = _plan(again, retention_floor_ms=DAY_MS, batch=4, deadline_floor_ms=2_000)
    assert events[:5] == [("lines", 4), ("watermark", 4.0), ("lines", 4), ("watermark", 8.0),
                          ("lines", 12)]
    assert events[5][0] == "watermark" and events[5][1] > 19 + 3600  # the final advance


def test_the_deadline_floor_is_the_least_deadline_unless_a_watermark_trigger_is_in_play(
) -> None:
    def floor(contract: str, **defaults: Any) -> int:
        text = f"contracts:\n  - {{name: c, required: [a], {contract}}}\n"
        return _deadline_floor_ms(Catalog(parse_contracts(text), JoinDefaults(**defaults)))

    assert floor("deadline_s: 7.5") == 7_500
    assert floor("deadline_s: 90") == 30_000  # the defaults' is less
    assert floor("deadline_s: 90", deadline_s=120) == 90_000
    assert floor("close_trigger: watermark") == 0
    assert floor("close_trigger: eager", close_trigger="watermark") == 0


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


def _files(out: Path) -> dict[str, bytes]:
    """Output files by ``kind/name``, the job token in a name replaced by ``<run>``."""
    return {f"{f.parent.name}/{re.sub(r'-(all|[0-9a-f]{12})-', '-<run>-', f.name)}":
            f.read_bytes() for f in sorted(out.glob("*/*.jsonl"))}


def test_a_replay_twice_writes_the_same_files(tmp_path: Path) -> None:
    """A replay writes as a bounded run does: one sorted file per shard (pane 0) when it ends,
    so twice the same input gives byte-identical files, and on input sorted by event time the
    bounded run's files (names but for the run)."""
    lines = [_open(f"j{i}", i) for i in range(8)] + [_receipt(f"j{i}", 8 + i) for i in range(6)]
    lines += ["not json", *[_receipt(f"j{i}", 30 + i) for i in range(6)], '{"join_id": 1}']
    path = write_lines(tmp_path / "in.jsonl", lines)
    found = []
    for name, replay in (("first", True), ("second", True), ("bounded", False)):
        out = tmp_path / name
        run_pipeline(RunConfig(output=str(out), inputs=[str(path)], replay=replay, shards=2,
                               defaults=JoinDefaults(close_trigger="watermark")), [])
        found.append(_files(out))
    assert found[0] == found[1] == found[2]
    assert all(re.fullmatch(r"(\w+)/\1-<run>-p0000-s00[01]\.jsonl", name) for name in found[0])
    assert [name for name in found[0] if not name.startswith("dead_letter/")] == [
        f"{kind}/{kind}-<run>-p0000-s00{shard}.jsonl" for kind in ("closes", "late")
        for shard in (0, 1)]


def test_a_file_changed_after_the_plan_is_replayed_as_planned_in_this_process(
        tmp_path: Path) -> None:
    """The local runners' worker takes the lines as the plan parsed them when the job was
    built: a file changed since changes nothing."""
    path = write_lines(tmp_path / "in.jsonl", [_open("a", 0), _receipt("a", 1)])
    replay = Replay(numbered_lines(str(path)), 0.0, DAY_MS, SCAN)
    write_lines(path, [_open("a", 0)])
    _SEEN.clear()
    with beam.Pipeline(options=PipelineOptions(["--runner=BundleBasedDirectRunner",
                                                "--streaming"])) as p:
        _ = (p | replay).records | "Records" >> beam.Map(_seen, "records")
    assert sorted(keyed[1][R.SOURCE][1] for _, keyed, _ in _SEEN) == [1, 2]


def test_a_worker_that_reads_a_file_changed_since_the_plan_fails_the_run(
        tmp_path: Path, worker_elsewhere: None) -> None:
    path = write_lines(tmp_path / "in.jsonl", [_open("a", 0), _receipt("a", 1)])
    replay = Replay(numbered_lines(str(path)), 0.0, DAY_MS, SCAN)
    write_lines(path, [_open("a", 0)])
    with pytest.raises(Exception, match="changed while it was replayed"), beam.Pipeline(
            options=PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])) as p:
        _ = p | replay


def test_the_plans_parse_lives_as_long_as_the_replay(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "in.jsonl", [_open("a", 0), _receipt("a", 1)])
    replay = Replay(numbered_lines(str(path)), 0.0, DAY_MS, SCAN)
    token = replay._tokens[0]
    assert [len(parsed) for parsed in replay_module._PARSED[token].values()] == [2]
    del replay
    gc.collect()
    assert token not in replay_module._PARSED


_SEEN: list[tuple[str, Any, int]] = []  # (output, element, timestamp in ms) seen by _seen


def _seen(element: Any, output: str, stamp: Any = beam.DoFn.TimestampParam) -> None:
    _SEEN.append((output, element, stamp.micros // 1000))


@pytest.fixture
def worker_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay's worker as one in another process (Prism's, Flink's) sees it: without the
    plan's parse, which stays in the process that built the job."""
    class _Elsewhere(dict[str, Any]):
        def __setitem__(self, key: str, value: Any) -> None:
            pass

    monkeypatch.setattr(replay_module, "_PARSED", _Elsewhere())


@pytest.mark.parametrize("worker", ["in this process", "in another process"])
def test_the_replay_parses_each_line_with_its_event_time(
        tmp_path: Path, worker: str, request: pytest.FixtureRequest) -> None:
    """The stream's lines leave parsed, as ``ParseMessages`` leaves them: records keyed by
    join_id on ``records``, dead letters (with their source) on ``DEAD_LETTER``, each with
    the line's event time (a dead letter's: the stream's watermark where it arrives); the
    same from the plan's parse and from a worker that reads and parses the file."""
    if worker == "in another process":
        request.getfixturevalue("worker_elsewhere")
    lines = [_open("a", 0), "not json", _receipt("a", 2), _receipt("b", 3, "z"),
             json.dumps({"join_id": "c", "branch": "x", "status": "ok", "event_time": _at(4),
                         "contract": "nope"})]
    path = write_lines(tmp_path / "in.jsonl", lines)
    _SEEN.clear()
    options = PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    p = beam.Pipeline(options=options)
    parsed = p | Replay(numbered_lines(str(path)), 0.0, DAY_MS, SCAN)
    _ = parsed.records | "Records" >> beam.Map(_seen, "records")
    _ = parsed[DEAD_LETTER] | "Dead" >> beam.Map(_seen, DEAD_LETTER)
    p.run().wait_until_finish()
    records = sorted((keyed[0], keyed[1][R.KIND], keyed[1][R.SOURCE][1], stamp)
                     for output, keyed, stamp in _SEEN if output == "records")
    assert records == [("a", R.OPEN, 1, T0), ("a", R.RECEIPT, 3, T0 + 2_000),
                       ("b", R.RECEIPT, 4, T0 + 3_000)]
    dead = sorted((obj["error"], obj["source"]["line"], stamp)
                  for output, obj, stamp in _SEEN if output == DEAD_LETTER)
    # a dead letter is stamped with the watermark where it arrives: at the first line none is
    # set (the latest event time, 0 s); the receipt of "a" at 2 s moved it there (its join
    # has an earlier line, retention floor 0), the first line of "b" did not
    assert dead == [("invalid_json", 2, T0), ("unknown_contract", 5, T0 + 2_000)]


def test_the_last_advance_passes_every_deadline_and_is_the_replays_end(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "in.jsonl", [_open("a", 0, deadline_s=90), _receipt("a", 5)])
    replay = Replay(numbered_lines(str(path)), 0.0, 60_001, SCAN)
    last = [e for e in replay._streams[0]._events if isinstance(e, WatermarkEvent)][-2]
    assert last.new_watermark.micros // 1000 == replay.end_ms
    assert replay.end_ms > T0 + 5_000 + 90_000 + 60_000  # the open's deadline and horizon_ms


class _CountedExpiry(JoinDoFn):
    """``JoinDoFn`` counting how often it drops all of a join's state (in ``_expiries`` only
    the tombstone's expiry does; the direct runner runs a copy of it in this process, so the
    count is the class's)."""

    expiries = 0
    outputs: list[tuple[str, str]] = []  # (kind, join id)

    @staticmethod
    def _clear(msgs: Any, meta: Any, decide_timer: Any, expire_timer: Any) -> None:
        _CountedExpiry.expiries += 1
        JoinDoFn._clear(msgs, meta, decide_timer, expire_timer)


def _note(obj: dict[str, Any], kind: str) -> None:
    _CountedExpiry.outputs.append((kind, obj["join_id"]))


def _expiries(input_end_s: float | None) -> tuple[int, list[str], list[str]]:
    """A join closing at 1 s (tombstone until 10 s + 1 h), a line at 50 s after its close; the
    stream ends at ``input_end_s`` (the join told so) or, with None, after every tombstone.
    Returns the tombstone expiries, the closes' and the late lines' join ids."""
    catalog = make_catalog(retention_s=3600)
    messages = [open_msg("j", 0, required=["a"], deadline_s=10), receipt("a", 1),
                receipt("a", 50)]
    stream = TestStream()
    for message in messages:
        at = parse_rfc3339(message.get("opened_at") or message["event_time"])
        stream.add_elements([TimestampedValue((json.dumps(message).encode(), ("in", 0)),
                                              Timestamp(micros=at * 1000))])
    end_ms = T0 + int((input_end_s if input_end_s is not None else 10**7) * 1000)
    stream.advance_watermark_to(Timestamp(micros=end_ms * 1000)).advance_watermark_to_infinity()
    _CountedExpiry.expiries, _CountedExpiry.outputs = 0, []
    options = PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    with beam.Pipeline(options=options) as p:
        parsed = p | stream | ParseMessages(frozenset(catalog.contracts))
        joined = parsed.records | beam.ParDo(_CountedExpiry(
            catalog, 100, input_end_ms=None if input_end_s is None else end_ms)
        ).with_outputs(LATE, DEAD_LETTER, main=CLOSES)
        for kind in (CLOSES, LATE):
            _ = joined[kind] | f"Note {kind}" >> beam.Map(_note, kind)
    found = _CountedExpiry.outputs
    return (_CountedExpiry.expiries, [j for k, j in found if k == CLOSES],
            [j for k, j in found if k == LATE])


def test_a_tombstone_outliving_the_input_has_no_timer_and_still_makes_lines_late() -> None:
    """``JoinDoFn(input_end_ms=...)``: a tombstone ending after the input's last watermark is
    never expired (no timer), one ending before it is, and the outputs are the same."""
    assert _expiries(100) == (0, ["j"], ["j"])  # tombstone ends at 3,610 s
    assert _expiries(4000) == (1, ["j"], ["j"])
    assert _expiries(None) == (1, ["j"], ["j"])  # no end known (Pub/Sub): always a timer


def test_the_plan_counts_its_events_and_the_lines_behind_the_watermark(tmp_path: Path) -> None:
    # an open every 100 s, then the previous join's receipt, 30 s behind it
    lines = [_open("j0", 0)] + [line for i in range(1, 6) for line in
                                (_open(f"j{i}", 100 * i), _receipt(f"j{i - 1}", 100 * i - 30))]
    path = write_lines(tmp_path / "in.jsonl", lines)
    lagging = Replay(numbered_lines(str(path)), 10.0, DAY_MS, SCAN,
                     retention_floor_ms=DAY_MS)
    assert (lagging.behind, lagging.largest_lag_ms) == (5, 30_000)
    assert lagging.events == len(lagging._streams[0]._events) - 1 > 5  # all but the jump to +inf
    covered = Replay(numbered_lines(str(path)), 30.0, DAY_MS, SCAN,
                     retention_floor_ms=DAY_MS)
    assert (covered.behind, covered.largest_lag_ms) == (0, 30_000)
    assert covered.events == len(covered._streams[0]._events) - 1 == 2  # the lines, the end


def test_a_replay_of_many_events_warns_and_names_the_disorder_that_covers_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from fanin.pipelines.pipeline import replay_of

    lines = [line for i in range(1, 1_200) for line in
             (_open(f"j{i}", 2 * i), _receipt(f"j{i}", 2 * i - 7.5))]  # each 7.5 s behind
    path = write_lines(tmp_path / "in.jsonl", lines)
    catalog = make_catalog()
    with caplog.at_level("WARNING", logger="fanin"):
        slow = replay_of(numbered_lines(str(path)), catalog, 5.0)
    assert slow.events > 1_000
    (warning,) = [r.getMessage() for r in caplog.records if "--replay" in r.getMessage()]
    assert warning.startswith(f"fanin: --replay: {slow.behind} lines lag the file's latest "
                              "event time by more than --max-disorder-s 5 (by up to 8 s)")
    assert warning.endswith("--max-disorder-s 8 covers this file's disorder")
    caplog.clear()
    with caplog.at_level("WARNING", logger="fanin"):
        fast = replay_of(numbered_lines(str(path)), catalog, 8.0)
    assert fast.behind == 0 and fast.events == 2 and not caplog.records


def test_a_replay_split_by_a_reused_join_id_says_so_not_a_disorder(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A join_id used again after its tombstone ended makes events with no line behind: the
    warning said "0 lines lag ... --max-disorder-s 0 covers this file's disorder"."""
    from fanin.pipelines import pipeline

    monkeypatch.setattr(pipeline, "_SLOW_REPLAY_EVENTS", 5)
    def at(day: int, second: int) -> str:
        return format_ms(T0 + day * DAY_MS + second * 1000)

    lines = [json.dumps(message) for day in range(4) for message in (
        {"kind": "open", "join_id": "nightly", "opened_at": at(day, 0), "required": ["a"]},
        {"join_id": "nightly", "branch": "a", "status": "ok", "event_time": at(day, 1)})]
    path = write_lines(tmp_path / "in.jsonl", lines)
    with caplog.at_level("WARNING", logger="fanin"):
        slow = pipeline.replay_of(numbered_lines(str(path)), make_catalog(retention_s=60), 0.0)
    assert slow.behind == 0 and slow.events > 5
    (warning,) = [r.getMessage() for r in caplog.records if "--replay" in r.getMessage()]
    assert warning.startswith(f"fanin: --replay: the stream splits into {slow.events} events "
                              "(no line lags the file's latest event time: lines of a join_id "
                              "used again")
    assert "--max-disorder-s" not in warning


def _sources(items: list[tuple[bytes, tuple[str, int]]]) -> list[tuple[str, int]]:
    return [source for _, source in items]


def test_several_files_arrive_merged_by_event_time() -> None:
    """Several files are several sources of one stream: each keeps its order, merged by event
    time; a line without a readable time follows the line before it in its file; ties go to
    the file given first; one file is read as it is."""
    first = [(_open("j", 0).encode(), ("p1", 1)), (b"not json", ("p1", 2)),
             (_receipt("j", 5).encode(), ("p1", 3)), (_receipt("k", 30).encode(), ("p1", 4))]
    second = [(_receipt("j", 0, "b").encode(), ("p2", 1)), (_receipt("j", 6, "b").encode(),
                                                            ("p2", 2))]
    assert _sources(list(by_event_time([first, second], SCAN))) == [
        ("p1", 1), ("p1", 2), ("p2", 1), ("p1", 3), ("p2", 2), ("p1", 4)]
    assert _sources(list(by_event_time([second, first], SCAN))) == [
        ("p2", 1), ("p1", 1), ("p1", 2), ("p1", 3), ("p2", 2), ("p1", 4)]
    unsorted = list(reversed(first))
    assert list(by_event_time([unsorted], SCAN)) == unsorted


def test_a_replay_of_files_each_sorted_gives_the_bounded_outputs(tmp_path: Path) -> None:
    """docs/spec.md §4: files each sorted by event time replay as one sorted file, so a
    watermark replay of them equals the bounded run. (Replayed one after the other, j's
    receipt from the second file came behind the watermark set by k, and j timed out.)"""
    part1 = write_lines(tmp_path / "part-1.jsonl",
                        [_two_branches("j", 0), _receipt("j", 5), _receipt("k", 30)])
    part2 = write_lines(tmp_path / "part-2.jsonl", [_receipt("j", 6, "b")])
    found = {}
    for mode in ("bounded", "replay"):
        run_pipeline(RunConfig(output=str(tmp_path / mode), inputs=[str(part1), str(part2)],
                               replay=mode == "replay",
                               defaults=JoinDefaults(close_trigger="watermark")), [])
        found[mode] = read_jsonl(tmp_path / mode)
    closes = {c["join_id"]: c for c in found["replay"][CLOSES]}
    assert (closes["j"]["reason"], closes["j"]["closed_at"], closes["j"]["counts"]["messages"]) \
        == ("complete", _at(6), 3)
    assert not found["replay"][LATE]
    for kind in (CLOSES, LATE, DEAD_LETTER):
        assert sorted(map(json.dumps, found["replay"][kind])) == \
            sorted(map(json.dumps, found["bounded"][kind])), kind


def test_more_files_than_the_soft_open_file_limit_are_merged(tmp_path: Path) -> None:
    """A replay holds its files open at once to merge them: the soft limit (often 1,024) is
    raised towards the hard one (the replay failed with "Too many open files")."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    paths = [write_lines(tmp_path / f"f{i:03d}.jsonl", [_open(f"j{i}", i % 60)])
             for i in range(150)]
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    try:
        merged = list(by_event_time([numbered_lines(str(p)) for p in paths], SCAN))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert sorted(source for _, source in merged) == [(str(p), 1) for p in paths]


def test_the_covering_disorder_is_the_largest_lag_of_a_message_the_join_takes() -> None:
    """``covering_disorder_s``: the largest lag behind the latest event time, in whole seconds
    rounded up, over the messages the join takes (a refused line's time counts for nothing,
    as in the replay), also before 1970."""
    def line(stamp: str, status: str = "ok") -> tuple[bytes, tuple[str, int]]:
        return json.dumps({"join_id": "j", "branch": "a", "status": status,
                           "event_time": stamp}).encode(), ("f", 0)

    assert covering_disorder_s([line("2026-01-01T00:00:10Z"), line("2026-01-01T00:00:05Z"),
                                line("2026-01-01T00:00:12Z"), line("2026-01-01T00:00:11.5Z"),
                                line("9999-01-01T00:00:00Z", status="bogus")], SCAN) == 5.0
    assert covering_disorder_s([line("1969-12-31T23:59:50Z"), line("1969-12-31T23:59:48.5Z")],
                               SCAN) == 2.0
    assert covering_disorder_s([line("2026-01-01T00:00:10Z")], SCAN) == 0.0
