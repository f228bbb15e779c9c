"""The bounded decision of one join as a stream (fanin.core.bounded.bounded_outputs): what it
reads, in what order it breaks ties, and what it does when the core fails part-way."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any
from unittest import mock

import pytest
from support.builders import make_catalog, open_msg, receipt, records, ts

from fanin.contracts import records as R
from fanin.core import bounded
from fanin.core.bounded import bounded_outputs
from fanin.core.full_join import TOO_LARGE_DETAIL

Output = tuple[str, dict[str, Any]]


class Reads:
    """A join's records that count how often they are read (like Beam's grouped values,
    they can be read again, in the same order)."""

    def __init__(self, recs: list[R.Record]) -> None:
        self.recs, self.reads = recs, 0

    def __iter__(self) -> Iterator[R.Record]:
        self.reads += 1
        return iter(self.recs)


def hot_join(receipts: int) -> list[R.Record]:
    """An open of contract ``strict`` (a, b required, D 10 s) and ``receipts`` identical
    receipts of branch a at 1 s: the join never completes and closes at D."""
    catalog = make_catalog()
    return records([open_msg(contract="strict")] + [receipt("a", 1)] * receipts, catalog)


def kinds(outputs: Iterable[Output]) -> Counter[str]:
    return Counter(obj.get("error") or obj.get("reason") or kind for kind, obj in outputs)


def test_a_join_within_the_limit_is_read_once() -> None:
    group = Reads(hot_join(5))
    outputs = list(bounded_outputs(group, make_catalog(), 6, 2**30))
    assert group.reads == 1
    assert [kind for kind, _ in outputs] == ["closes"]
    assert outputs[0][1]["counts"]["messages"] == 6


def test_a_hot_join_is_read_three_times_and_its_overflow_streams() -> None:
    group = Reads(hot_join(9))
    stream = bounded_outputs(group, make_catalog(), 4, 2**30)
    kind, close = next(stream)  # decided from the first 4 (the open and 3 receipts)
    assert (kind, close["counts"]["messages"], close["reason"]) == ("closes", 4, "timeout")
    assert group.reads == 1  # decided from one reading; the rest is read again as it streams
    rest = list(stream)
    assert group.reads == 3  # and once more for the next decision: nothing after the tombstone
    assert kinds(rest) == {"join_too_large": 6}
    assert all(obj["detail"] == TOO_LARGE_DETAIL for _, obj in rest)


def test_equal_records_beyond_the_limit_are_the_later_ones_in_input_order() -> None:
    # a stable sort by arrival order: identical messages keep the order the input gave them
    recs = hot_join(6)
    shuffled = [recs[3], recs[0], recs[6], recs[1], recs[5], recs[2], recs[4]]
    outputs = list(bounded_outputs(shuffled, make_catalog(), 3, 2**30))
    lines = [obj["source"]["line"] for kind, obj in outputs if kind == "dead_letter"]
    assert sorted(lines) == [1, 2, 4, 5]  # held: the open (0), then receipts 3 and 6


def test_a_byte_limit_below_the_message_limit_holds_the_fitting_prefix() -> None:
    recs = hot_join(4)
    size = sum(bounded.message_bytes(r) for r in recs[:3])
    outputs = list(bounded_outputs(recs, make_catalog(), 100, size))
    assert kinds(outputs) == {"timeout": 1, "join_too_large": 2}
    assert next(obj for kind, obj in outputs if kind == "closes")["counts"]["messages"] == 3


def test_overflow_after_the_close_is_late_and_after_the_tombstone_starts_the_next_join(
        ) -> None:
    # short: D 10 s, retention 5 s: the join holds the open, a and b and closes complete at
    # 2 s; a at 3 s and 4 s are beyond the limit and after the close; after 15 s a new join
    catalog = make_catalog()
    recs = records([open_msg(contract="short"), receipt("a", 1), receipt("b", 2),
                    receipt("a", 3), receipt("a", 4), receipt("a", 20, contract="short"),
                    receipt("b", 21, contract="short")], catalog)
    outputs = list(bounded_outputs(Reads(recs), catalog, 3, 2**30))
    closes = [obj for kind, obj in outputs if kind == "closes"]
    assert [(c["counts"]["messages"], c["reason"], c["closed_at"]) for c in closes] == \
        [(3, "complete", "2026-01-01T00:00:02.000Z"), (2, "complete", "2026-01-01T00:00:21.000Z")]
    late = [obj for kind, obj in outputs if kind == "late"]
    assert sorted((obj["reason"], obj["message"]["event_time"]) for obj in late) == \
        [("after_close", "2026-01-01T00:00:03.000Z"), ("after_close", "2026-01-01T00:00:04.000Z")]
    assert len(outputs) == 4


def test_a_failure_gives_the_undecided_records_to_on_error_once_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = make_catalog()
    recs = records([open_msg(contract="short"), receipt("a", 1), receipt("a", 2),
                    receipt("a", 3), receipt("a", 20, contract="short"),
                    receipt("b", 21, contract="short")], catalog)
    decisions = []
    decide = bounded.decide

    def second_fails(held: list[R.Record], *args: Any) -> Any:
        decisions.append(len(held))
        if len(decisions) == 2:
            raise RuntimeError("boom")
        return decide(held, *args)

    monkeypatch.setattr(bounded, "decide", second_fails)
    failed: list[tuple[str, list[R.Record]]] = []

    def on_error(exc: Exception, undecided: Iterable[R.Record]) -> list[Output]:
        undecided = list(undecided)
        failed.append((str(exc), undecided))
        return [("dead_letter", {"error": "internal_error", "line": r[R.SOURCE]["line"]})
                for r in undecided]

    outputs = list(bounded_outputs(Reads(recs), catalog, 2, 2**30, on_error=on_error))
    # round 1 (up to the tombstone's end at 15 s) stands; round 2's records go to on_error
    assert [(msg, [r[R.SOURCE]["line"] for r in undecided]) for msg, undecided in failed] == \
        [("boom", [4, 5])]
    assert kinds(outputs) == {"timeout": 1, "join_too_large": 2, "internal_error": 2}
    with pytest.raises(RuntimeError, match="boom"):  # without on_error the failure propagates
        decisions.clear()
        list(bounded_outputs(recs, catalog, 2, 2**30))


def test_one_join_id_reused_over_many_rounds_takes_work_linear_in_its_records() -> None:
    """2,000 receipts of one join id, each undefined at its deadline before the next: 2,000
    rounds. Each round was decided over every record left (16,000 such receipts took 39 s,
    32,000 over 150 s); now over the few records its decision needs."""
    catalog = make_catalog()
    # and a straggler after them all that names the first one's time as its opened_at: it
    # acts on no round before its own (a window that waited for it grew to every record)
    recs = records([receipt("a", 31 * i) for i in range(2000)] +
                   [receipt("b", 31 * 2000 + 5, opened_at=ts(0))], catalog)
    decided: list[int] = []
    real = bounded.decide

    def counting(held: list[R.Record], *args: Any) -> Any:
        decided.append(len(held))
        return real(held, *args)

    with mock.patch.object(bounded, "decide", counting):
        outputs = list(bounded_outputs(recs, catalog, 100_000, 16 << 20))
    assert kinds(outputs) == Counter({"undefined_join": 2001})
    assert len(decided) <= 2 * 2000 and sum(decided) <= 40 * 2000, sum(decided)


def test_opens_of_one_millisecond_recount_the_join_once() -> None:
    """1,000 receipts of undeclared branches, then 1,000 distinct opens of one millisecond,
    each with a smaller text (so each became the defining open): the join's counters were
    recounted over every branch once per open (8,000 of each took 62 s); now once for the
    millisecond."""
    from fanin.core.reducer import JoinReducer

    catalog = make_catalog()
    recs = records([receipt(f"u{i:04d}", 0) for i in range(1000)] +
                   [open_msg(at=0.001, required=["r"], deadline_s=999_999 - i)
                    for i in range(1000)], catalog)
    calls = 0
    real = JoinReducer._contribution

    def counting(self: JoinReducer, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(self, *args)

    with mock.patch.object(JoinReducer, "_contribution", counting):
        outputs = list(bounded_outputs(recs, catalog, 100_000, 16 << 20))
    [(kind, close)] = outputs
    assert kind == "closes" and close["counts"]["messages"] == 2000
    assert calls <= 10 * 1000, calls


def test_a_hot_join_id_over_many_rounds_reads_its_records_a_few_times_per_limit() -> None:
    """2,000 receipts of one join id 31 s apart, each its own (undefined) round, at a limit
    of 50 messages: a join beyond its limit is not held whole, so its records are read again
    for a round — but the rounds the records held can decide are decided from them (one read
    and one more for what is beyond the limit per ~50 rounds; it read them twice per round,
    ~4,000 times)."""
    catalog = make_catalog()
    join = Reads(records([receipt("a", 31 * i) for i in range(2000)], catalog))
    outputs = list(bounded_outputs(join, catalog, 50, 16 << 20))
    assert kinds(outputs) == Counter({"undefined_join": 2000})
    assert join.reads <= 4 * 2000 // 50 + 4, join.reads


def test_the_per_join_byte_limit_counts_utf8_bytes_not_characters() -> None:
    """docs/spec.md §4: a join holds at most ``--max-bytes-per-join`` bytes of messages. Two
    receipts whose values are 45 ``é`` (two bytes each in UTF-8) fit the limit counted in
    characters but not in bytes: the second is ``join_too_large``, and the join, missing b,
    times out."""
    import json

    from fanin.contracts.parsing import parse_message

    catalog = make_catalog()
    value = "\u00e9" * 45
    recs = [parse_message(json.dumps(m, ensure_ascii=False), ("in.jsonl", i),
                          catalog.contracts)[0]
            for i, m in enumerate([open_msg(contract="strict"), receipt("a", 1, value=value),
                                   receipt("b", 2, value=value)])]
    assert all(recs)
    chars = sum(len(r[R.RAW]) for r in recs)
    utf8 = sum(len(r[R.RAW].encode()) for r in recs)
    limit = utf8 - 1
    assert chars < limit
    outputs = list(bounded_outputs(recs, catalog, 100, limit))
    assert [(kind, obj.get("error")) for kind, obj in outputs if kind == "dead_letter"] == [
        ("dead_letter", "join_too_large")]
    closes = [obj for kind, obj in outputs if kind == "closes"]
    assert [(c["reason"], c["counts"]["messages"]) for c in closes] == [("timeout", 2)]
    assert next(obj for kind, obj in outputs if kind == "dead_letter")["raw"] == recs[2][R.RAW]
