"""docs/spec.md §4 in streaming: the stateful join under TestStream with watermark control."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from support.builders import make_catalog, open_msg, receipt, ts

from fanin.contracts.timefmt import parse_rfc3339
from fanin.core.outcomes import CLOSES, DEAD_LETTER, LATE
from fanin.transforms.join import JoinRecords
from fanin.transforms.parse import ParseMessages

EPOCH_MS = parse_rfc3339("2026-01-01T00:00:00Z")
EPOCH_S = EPOCH_MS / 1000
END_S = EPOCH_S + 10**7  # past every deadline + retention used here (docs/beam-notes.md trap)

Event = tuple[str, Any]


def add(*messages: dict[str, Any]) -> Event:
    return ("add", messages)


def watermark(seconds: float) -> Event:
    """The watermark to ``seconds`` after the epoch, to the millisecond."""
    return ("wm", seconds)


def _micros(seconds: float) -> Timestamp:
    return Timestamp(micros=EPOCH_MS * 1000 + round(seconds * 1000) * 1000)


def _stamp(message: dict[str, Any]) -> Timestamp:
    text = message.get("opened_at") if message.get("kind") == "open" else message["event_time"]
    return Timestamp(micros=parse_rfc3339(text) * 1000)


def run_stream(events: Sequence[Event], checks: dict[str, Callable[[list[Any]], None]],
               project: dict[str, Callable[[dict[str, Any]], Any]],
               max_messages: int = 100_000, max_bytes: int | None = None) -> None:
    """Replay ``events`` through Parse + streaming Join; ``checks`` run on projected outputs."""
    stream = TestStream()
    for kind, arg in events:
        if kind == "add":
            stream.add_elements([
                TimestampedValue((json.dumps(m).encode(), {"kind": "test"}), _stamp(m))
                for m in arg])
        else:
            stream.advance_watermark_to(_micros(arg))
    stream.advance_watermark_to(Timestamp(END_S)).advance_watermark_to_infinity()
    options = PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    catalog = make_catalog()
    with TestPipeline(options=options) as p:
        parsed = p | stream | ParseMessages(frozenset(catalog.contracts))
        limits = {} if max_bytes is None else {"max_bytes_per_join": max_bytes}
        joined = parsed.records | JoinRecords(catalog, streaming=True,
                                              max_messages_per_join=max_messages, **limits)
        outputs = {CLOSES: joined[CLOSES], LATE: joined[LATE],
                   DEAD_LETTER: (joined[DEAD_LETTER], parsed[DEAD_LETTER]) | beam.Flatten()}
        for name, check in checks.items():
            assert_that(outputs[name] | f"Project {name}" >> beam.Map(project[name]),
                        check, label=f"check {name}")


def close_key(close: dict[str, Any]) -> tuple[Any, ...]:
    return (close["join_id"], close["reason"], close["closed_at"][11:19],
            close["counts"]["messages"])


def late_key(line: dict[str, Any]) -> tuple[Any, ...]:
    return (line["join_id"], line["reason"], line["close_reason"], line["message"].get("branch"))


PROJECT = {CLOSES: close_key, LATE: late_key, DEAD_LETTER: lambda d: (d["error"],)}


def test_eager_closes_on_arrival_before_any_watermark_advance() -> None:
    # the second "b" has an earlier event time than the close, but arrives after it: late
    run_stream(
        [add(open_msg(contract="strict"), receipt("a", 1), receipt("b", 2)),
         add(receipt("b", 1.5)), watermark(1)],
        {CLOSES: equal_to([("j", "complete", "00:00:02", 3)]),
         LATE: equal_to([("j", "after_close", "complete", "b")])}, PROJECT)


def test_eager_closes_on_the_arrival_that_moves_the_deadline_behind_itself() -> None:
    """a and b name ``triage`` (which needs other branches); x names ``strict`` (the least
    name wins: a and b by 10 s), which moves ``D`` to 11 s, before x at 15 s (docs/spec.md §2,
    step 2). The messages received make the join closable at 2 s, so the eager close fires on
    x's arrival and q, arriving after it, is late. It waited for the watermark to pass 15 s,
    took q in (an unknown branch) and closed ``timeout``."""
    run_stream(
        [add(receipt("a", 1, contract="triage"), receipt("b", 2, contract="triage")),
         add(receipt("x", 15, contract="strict")), add(receipt("q", 0.5)), watermark(100)],
        {CLOSES: equal_to([("j", "complete", "00:00:02", 2)]),
         LATE: equal_to([("j", "after_deadline", "complete", "x"),
                         ("j", "after_close", "complete", "q")])}, PROJECT)


def test_a_message_after_the_deadline_does_not_close_an_eager_prefix() -> None:
    """x (an unknown branch) arrived first and breaks completeness: only the prefix up to b
    is closable, so the close waits for D (docs/spec.md §4). z, after D, moved nothing; it
    made the join close on that prefix (complete at 3 s)."""
    run_stream(
        [add(open_msg(contract="strict"), receipt("x", 8), receipt("a", 2), receipt("b", 3)),
         add(receipt("z", 12)), add(receipt("y", 1)), watermark(100)],
        {CLOSES: equal_to([("j", "timeout", "00:00:10", 5)]),
         LATE: equal_to([("j", "after_deadline", "timeout", "z")])}, PROJECT)


def test_a_moved_deadline_waits_when_a_message_received_breaks_completeness() -> None:
    """Under ``strict`` (D 11 s, moved behind x at 15 s) a and b are closable at 2 s, but q
    (5 s, before D), received first, is an unknown branch: only that prefix is closable, so
    the close waits for the watermark and takes y in, as the bounded run does. It closed
    ``complete`` at 2 s on x's arrival."""
    run_stream(
        [add(receipt("q", 5, contract="triage")),
         add(receipt("a", 1, contract="triage"), receipt("b", 2, contract="triage")),
         add(receipt("x", 15, contract="strict")), add(receipt("y", 1.5)), watermark(100)],
        {CLOSES: equal_to([("j", "timeout", "00:00:11", 4)]),
         LATE: equal_to([("j", "after_deadline", "timeout", "x")])}, PROJECT)


def test_watermark_trigger_waits_for_the_watermark() -> None:
    # contract "watch": a retry of "a" that arrives after "b" but before the watermark
    # passes 2 s is part of the close (under eager it would be late)
    run_stream(
        [add(open_msg(contract="watch"), receipt("a", 1), receipt("b", 2)), watermark(1.5),
         add(receipt("a", 1.7, attempt=2, value="better")), watermark(3)],
        {CLOSES: equal_to([("j", "complete", "00:00:02", 4)]), LATE: equal_to([])}, PROJECT)


def test_deadline_timeout_and_partial() -> None:
    run_stream(
        [add(open_msg("t", contract="strict"), receipt("a", 1, join_id="t"),
             open_msg("p", contract="triage"), receipt("rank", 1, join_id="p")),
         watermark(9), watermark(40)],
        {CLOSES: equal_to([("t", "timeout", "00:00:10", 2), ("p", "partial", "00:00:30", 2)])},
        PROJECT)


def test_a_receipt_at_exactly_the_deadline_counts() -> None:
    run_stream(
        [add(open_msg(contract="strict"), receipt("a", 1)), watermark(9.999),
         add(receipt("b", 10)), watermark(11)],
        {CLOSES: equal_to([("j", "complete", "00:00:10", 3)])}, PROJECT)


def test_after_close_and_after_deadline() -> None:
    run_stream(
        [add(open_msg(contract="strict"), receipt("a", 1), receipt("b", 2)), watermark(20),
         add(receipt("a", 5, value="x"), receipt("b", 11))],
        {CLOSES: equal_to([("j", "complete", "00:00:02", 3)]),
         LATE: equal_to([("j", "after_close", "complete", "a"),
                         ("j", "after_deadline", "complete", "b")])}, PROJECT)


def test_tombstone_expires_after_deadline_plus_retention() -> None:
    # contract "short": deadline 10 s, retention 5 s -> tombstone until 15 s
    run_stream(
        [add(open_msg(contract="short"), receipt("a", 1), receipt("b", 2)), watermark(14),
         add(receipt("a", 14, value="late")), watermark(16),
         add(open_msg(at=16, contract="short"), receipt("a", 16), receipt("b", 17))],
        {CLOSES: equal_to([("j", "complete", "00:00:02", 3), ("j", "complete", "00:00:17", 3)]),
         LATE: equal_to([("j", "after_deadline", "complete", "a")])}, PROJECT)


def test_a_straggler_after_the_tombstone_starts_the_next_join_while_the_watermark_lags(
        ) -> None:
    # contract "short": tombstone until 15 s. The next join's messages (16-17 s) arrive while
    # the watermark is still at 12 s (a disorder allowance): they wait for the tombstone to
    # expire and close as the second join, as in the bounded plan; a@14 is late.
    run_stream(
        [add(open_msg(contract="short"), receipt("a", 1), receipt("b", 2)), watermark(12),
         add(open_msg(at=16, contract="short"), receipt("a", 16), receipt("a", 14, value="x"),
             receipt("b", 17)),
         watermark(30)],
        {CLOSES: equal_to([("j", "complete", "00:00:02", 3), ("j", "complete", "00:00:17", 3)]),
         LATE: equal_to([("j", "after_deadline", "complete", "a")])}, PROJECT)


def test_messages_after_the_tombstone_received_before_the_close_start_the_next_join(
        ) -> None:
    # everything arrives before the watermark moves: the first join closes at 2 s when the
    # watermark passes it; the messages after its tombstone (15 s) are the next join's
    run_stream(
        [add(open_msg(contract="short"), receipt("a", 1), receipt("b", 2),
             open_msg(at=16, contract="short"), receipt("a", 16), receipt("b", 17),
             receipt("b", 12, value="y")),
         watermark(30)],
        {CLOSES: equal_to([("j", "complete", "00:00:02", 3), ("j", "complete", "00:00:17", 3)]),
         LATE: equal_to([("j", "after_deadline", "complete", "b")])}, PROJECT)


def test_the_next_join_waiting_for_the_tombstone_keeps_the_per_join_limit() -> None:
    # limit 3: the next join's first three messages wait for the tombstone (15 s) to expire;
    # its decision over them is final (complete at 17 s), so a fourth, a@18, is late of it,
    # as in the bounded plan (docs/spec.md §4, Tombstones and per-join limits)
    run_stream(
        [add(open_msg(contract="short"), receipt("a", 1), receipt("b", 2)), watermark(12),
         add(open_msg(at=16, contract="short"), receipt("a", 16), receipt("b", 17),
             receipt("a", 18, attempt=2)),
         watermark(30)],
        {CLOSES: equal_to([("j", "complete", "00:00:02", 3), ("j", "complete", "00:00:17", 3)]),
         LATE: equal_to([("j", "after_close", "complete", "a")]), DEAD_LETTER: equal_to([])},
        PROJECT, max_messages=3)


def test_a_full_join_whose_close_is_final_lets_the_next_join_start() -> None:
    # limit 3, watermark held back: the bag fills with the first join's open and "a" and the
    # next join's open (16 s, after the tombstone's end at 15 s). The first join's decision
    # is final (timeout at 10 s); "b"@17 and "a"@18 come after its tombstone, so they are the
    # next join's, as in the bounded plan (they were late after_deadline of the first join).
    run_stream(
        [add(open_msg(contract="short"), receipt("a", 1)),
         add(open_msg(at=16, contract="short"), receipt("b", 17), receipt("a", 18)),
         watermark(40)],
        {CLOSES: equal_to([("j", "timeout", "00:00:10", 2), ("j", "complete", "00:00:18", 3)]),
         LATE: equal_to([]), DEAD_LETTER: equal_to([])}, PROJECT, max_messages=3)


def test_an_earlier_deadline_in_force_decides_though_a_later_message_arrived_first() -> None:
    # "strict" (D = opened_at + 10 s): b@28 carrying opened_at 28 arrives before a@0. Over a@0
    # alone D is 10 s, and b comes after it: the join times out at 10 s (docs/spec.md §2,
    # definition over time). Its timer was set for D of both (38 s), so b@3, arriving once
    # the watermark passed 10 s, joined the close.
    run_stream(
        [add(receipt("b", 28, status="error", opened_at=ts(28))),
         add(receipt("a", 0, contract="strict")), watermark(30), add(receipt("b", 3))],
        {CLOSES: equal_to([("j", "timeout", "00:00:10", 1)]),
         LATE: equal_to([("j", "after_deadline", "timeout", "b"),
                         ("j", "after_close", "timeout", "b")])}, PROJECT)


def test_a_watermark_join_closes_when_the_watermark_passes_a_prefix_close_time() -> None:
    # x@8 (an unknown branch, a conflict) arrives before a@2 and b@3: the messages up to 3 s
    # make the join complete; it closes when the watermark passes 3 s, so y@1 arriving later
    # is late (its timer waited for D = 10 s, and y, behind the watermark, made it a timeout)
    run_stream(
        [add(open_msg(contract="watch"), receipt("x", 8), receipt("a", 2), receipt("b", 3)),
         watermark(9), add(receipt("y", 1))],
        {CLOSES: equal_to([("j", "complete", "00:00:03", 3)]),
         LATE: equal_to([("j", "after_close", "complete", "x"),
                         ("j", "after_close", "complete", "y")])}, PROJECT)


def test_receipts_before_their_open_and_out_of_order_delivery() -> None:
    run_stream(
        [add(receipt("b", 3)), add(receipt("a", 1)), add(open_msg(contract="watch")),
         watermark(5)],
        {CLOSES: equal_to([("j", "complete", "00:00:03", 3)])}, PROJECT)


def test_pruning_by_skip_completes_the_route_not_taken() -> None:
    run_stream(
        [add(open_msg(contract="routed"), receipt("classify", 1), receipt("review", 2,
             status="skipped"), receipt("answer", 3)), watermark(4)],
        {CLOSES: equal_to([("j", "complete", "00:00:03", 4)])}, PROJECT)


def test_undefined_join_and_bad_input_go_to_dead_letter() -> None:
    run_stream(
        [add(receipt("a", 1, join_id="u")), watermark(40)],
        {DEAD_LETTER: equal_to([("undefined_join",)]), CLOSES: equal_to([])}, PROJECT)


def test_a_hot_watermark_join_closes_once_at_the_least_time() -> None:
    # after "b" completes the join at 2 s, redeliveries keep arriving before the watermark
    # passes 2 s (they do not re-run the decision): the close is at 2 s, every later copy late
    run_stream(
        [add(open_msg(contract="watch"), receipt("a", 1), receipt("b", 2)),
         add(*[receipt("b", 2 + i) for i in range(1, 6)]), watermark(10)],
        {CLOSES: equal_to([("j", "complete", "00:00:02", 3)]),
         LATE: equal_to([("j", "after_close", "complete", "b")] * 5)}, PROJECT)


def _walks(monkeypatch: Any) -> list[int]:
    """The number of records of each closing decision the streaming join asks for (``decide``
    counted where ``fanin.transforms.join_streaming`` calls it, in this process)."""
    from fanin.transforms import join_streaming

    walked: list[int] = []
    decide = join_streaming.decide

    def counted(records: list[Any], *args: Any) -> Any:
        walked.append(len(records))
        return decide(records, *args)

    monkeypatch.setattr(join_streaming, "decide", counted)
    return walked


def test_arrivals_after_a_pending_decision_do_not_walk_the_join_again(monkeypatch: Any
                                                                      ) -> None:
    """An eager join made closable only by messages after ``D`` waits for the watermark to
    pass ``D`` (docs/spec.md §4); the 300 messages that keep arriving after ``D`` meanwhile
    each walked every message the join held (45,000 records in all: quadratic; 32,000 such
    receipts took 87 s against 2.7 s bounded). A pending decision stands for messages after
    its time: the walks are now linear in the messages."""
    walked = _walks(monkeypatch)
    run_stream(
        [add(open_msg(contract="strict"), receipt("a", 11), receipt("b", 11.5)),
         add(*[receipt("b", 12 + i / 100) for i in range(300)]), watermark(100)],
        {CLOSES: equal_to([("j", "timeout", "00:00:10", 1)]),
         LATE: equal_to([("j", "after_deadline", "timeout", "a")] +
                        [("j", "after_deadline", "timeout", "b")] * 301)}, PROJECT)
    assert 0 < sum(walked) <= 4 * 303, (len(walked), sum(walked))


def test_a_large_watermark_join_is_not_re_decided_on_each_earlier_arrival(monkeypatch: Any
                                                                          ) -> None:
    """A ``watermark`` join complete at 5 s (its timer pending there) then receives 1,100
    earlier retries of ``a`` reporting ``error`` (lower attempts): each arrival earlier than
    the pending close re-walked the join (8,000 such receipts took 93 s against 3 s
    bounded). A join holding 1,000 messages or more is decided by its timer instead
    (docs/spec.md §4), with the same close: every message, complete at 5 s."""
    from fanin.transforms.join_streaming import _WALK_LIMIT

    walked = _walks(monkeypatch)
    run_stream(
        [add(open_msg(contract="watch"), receipt("a", 5, attempt=2000), receipt("b", 5)),
         add(*[receipt("a", (i + 1) / 1000, attempt=i + 1, status="error")
               for i in range(1100)]), watermark(100)],
        {CLOSES: equal_to([("j", "complete", "00:00:05", 1103)]), LATE: equal_to([])},
        PROJECT)
    assert walked and sum(1 for n in walked if n > _WALK_LIMIT) <= 2, \
        [n for n in walked if n > _WALK_LIMIT]


# --- messages at exactly a boundary: D, the tombstone's end, a pending time, the horizon -----

def _close_ms(close: dict[str, Any]) -> tuple[Any, ...]:
    return (close["reason"], close["closed_at"][11:23], close["counts"]["messages"])


def _late_at(line: dict[str, Any]) -> tuple[Any, ...]:
    message = line["message"]
    return (line["reason"], line["close_reason"], message.get("branch"),
            (message.get("event_time") or message["opened_at"])[11:23])


EXACT = {CLOSES: _close_ms, LATE: _late_at, DEAD_LETTER: lambda d: d["error"]}


def test_a_watermark_at_a_close_time_still_admits_messages_at_it() -> None:
    """``watch`` is complete at 2.001 s (b's attempt 2); the watermark then stands at exactly
    2.001 s, which still admits messages at 2.001 s (timers fire 1 ms after the time they
    decide, docs/spec.md §4): a's attempt 2 there, an ``error``, undoes completeness, and the
    join times out at D holding all six."""
    run_stream(
        [add(open_msg(contract="watch"), receipt("a", 1), receipt("b", 2, value="v")),
         add(receipt("b", 2, value="w")), add(receipt("b", 2.001, attempt=2, value="z")),
         watermark(2.001), add(receipt("a", 2.001, attempt=2, status="error")),
         watermark(100)],
        {CLOSES: equal_to([("timeout", "00:00:10.000", 6)]), LATE: equal_to([])}, EXACT)


def test_a_message_at_exactly_the_tombstone_s_end_is_late() -> None:
    """``short`` closes at 2 s (D 10 s, retention 5 s): a message at exactly D + retention
    (15 s) is late, not the start of a next join (docs/spec.md §4, tombstones)."""
    run_stream(
        [add(open_msg(contract="short"), receipt("a", 1), receipt("b", 2)), watermark(12),
         add(receipt("a", 15, contract="short")), watermark(100)],
        {CLOSES: equal_to([("complete", "00:00:02.000", 3)]),
         LATE: equal_to([("after_deadline", "complete", "a", "00:00:15.000")]),
         DEAD_LETTER: equal_to([])}, EXACT)


def test_an_eager_close_on_an_arrival_at_its_pending_time_is_final() -> None:
    """``strict`` (D 10 s) holds b and a after D: pending at D. a at exactly 10 s completes it:
    the eager join closes on that arrival, so b's redelivery after it is late ``after_close``
    (the decision pending at 10 s does not stand for a message at 10 s)."""
    run_stream(
        [add(open_msg(contract="strict"), receipt("b", 3)), add(receipt("a", 11)),
         add(receipt("a", 10)), add(receipt("b", 3))],
        {CLOSES: equal_to([("complete", "00:00:10.000", 3)]),
         LATE: equal_to([("after_deadline", "complete", "a", "00:00:11.000"),
                         ("after_close", "complete", "b", "00:00:03.000")])}, EXACT)


def test_an_eager_join_completed_at_exactly_its_deadline_closes_on_arrival() -> None:
    run_stream(
        [add(open_msg(contract="strict"), receipt("a", 1)), add(receipt("b", 10)),
         add(receipt("a", 1))],
        {CLOSES: equal_to([("complete", "00:00:10.000", 3)]),
         LATE: equal_to([("after_close", "complete", "a", "00:00:01.000")])}, EXACT)


def test_a_message_at_exactly_the_known_horizon_is_decided_on_arrival() -> None:
    """The watermark passed 3 s, where ``watch`` is complete (b at 3 s); x (5 s, an unknown
    branch) waits. Then, in one bundle, b's attempt 2 at exactly 3 s and a's ``error`` at 2 s:
    b's is at the horizon the join knows, so it is decided on arrival: the close at 3 s holds
    it (five messages) and x is late; a's error comes after that close: late too."""
    run_stream(
        [add(open_msg(contract="watch"), receipt("a", 1), receipt("b", 3, value="v")),
         add(receipt("b", 3, value="w")), watermark(3.001), add(receipt("x", 5)),
         add(receipt("b", 3, attempt=2), receipt("a", 2, attempt=2, status="error")),
         watermark(100)],
        {CLOSES: equal_to([("complete", "00:00:03.000", 5)]),
         LATE: equal_to([("after_close", "complete", "x", "00:00:05.000"),
                         ("after_close", "complete", "a", "00:00:02.000")])}, EXACT)


def test_the_first_message_over_the_byte_limit_ends_what_the_join_holds() -> None:
    """docs/spec.md §4: the per-join byte limit. The limit fits the open, a and b, not a's
    400-byte attempt 2: that attempt ends what the join holds, so b after it is
    ``join_too_large`` too and the join times out holding two."""
    parts = (open_msg(contract="strict"), receipt("a", 1), receipt("b", 3))
    limit = sum(len(json.dumps(m).encode()) for m in parts) + 20
    run_stream(
        [add(parts[0]), add(parts[1]), add(receipt("a", 2, attempt=2, value="x" * 400)),
         add(parts[2]), watermark(100)],
        {CLOSES: equal_to([("timeout", "00:00:10.000", 2)]), LATE: equal_to([]),
         DEAD_LETTER: equal_to(["join_too_large", "join_too_large"])}, EXACT, max_bytes=limit)


def test_messages_waiting_for_a_tombstone_count_their_bytes_once() -> None:
    """The next join's messages, received while ``short``'s tombstone lives, wait for it; the
    byte limit fits each join whole: the next join closes complete at 17 s, nothing refused."""
    first = [open_msg(contract="short"), receipt("a", 1), receipt("b", 2)]
    later = [open_msg(at=16, contract="short"), receipt("a", 16), receipt("b", 17)]
    limit = max(sum(len(json.dumps(m).encode()) for m in ms) for ms in (first, later)) + 10
    run_stream(
        [add(*first), watermark(12), add(later[0]), add(later[1]), add(later[2]),
         watermark(100)],
        {CLOSES: equal_to([("complete", "00:00:02.000", 3), ("complete", "00:00:17.000", 3)]),
         LATE: equal_to([]), DEAD_LETTER: equal_to([])}, EXACT, max_bytes=limit)


def test_a_message_beyond_the_limit_at_exactly_the_close_time_is_too_large() -> None:
    """A full join (limit 2) closes at D = 10 s; a message beyond the limit is late only if
    the join closes before its event time (docs/spec.md §4): b at exactly 10 s is
    ``join_too_large``."""
    run_stream(
        [add(open_msg(contract="strict"), receipt("a", 1)), add(receipt("b", 10)),
         watermark(100)],
        {CLOSES: equal_to([("timeout", "00:00:10.000", 2)]), LATE: equal_to([]),
         DEAD_LETTER: equal_to(["join_too_large"])}, EXACT, max_messages=2)
