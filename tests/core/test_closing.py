"""docs/spec.md §4 closing decisions on bounded input (the exact event-time result)."""

from __future__ import annotations

from typing import Any

from support.builders import make_catalog, open_msg, receipt, records, ts

from fanin.contracts import records as R
from fanin.contracts.records import Record
from fanin.contracts.timefmt import parse_rfc3339
from fanin.core.closing import Closed, Pending, Undefined, decide


def outcome(messages: list[dict[str, Any]], **defaults: Any
            ) -> tuple[Closed | None, list[Record]]:
    """The bounded decision: undefined joins' records rejected, then the close (if any)."""
    catalog = make_catalog(**defaults)
    pending, rejected = records(messages, catalog), []
    while pending:
        decided = decide(pending, catalog, None)
        if isinstance(decided, Closed):
            return decided, rejected
        assert isinstance(decided, Undefined), decided
        rejected += decided.rejected
        pending = decided.rest
    return None, rejected


def test_least_complete_time_and_late_reasons() -> None:
    closed, _ = outcome([
        open_msg(contract="strict"),
        receipt("a", 2), receipt("b", 5), receipt("b", 7, value=2), receipt("a", 11),
    ])
    assert closed is not None and closed.close["closed_at"] == "2026-01-01T00:00:05.000Z"
    assert [reason for _, reason in closed.late] == ["after_close", "after_deadline"]
    assert closed.close["counts"]["messages"] == 3


def test_deadline_timeout_and_partial() -> None:
    msgs = [open_msg(contract="strict"), receipt("a", 2)]
    closed, _ = outcome(msgs)
    assert closed is not None and closed.reason == "timeout"
    assert closed.close["closed_at"] == closed.close["deadline"] == "2026-01-01T00:00:10.000Z"
    closed, _ = outcome([open_msg(contract="strict", allow_partial=True), receipt("a", 2)])
    assert closed is not None and closed.reason == "partial"


def test_a_message_at_exactly_the_deadline_is_included() -> None:
    closed, _ = outcome([open_msg(contract="strict"), receipt("a", 2), receipt("b", 10)])
    assert closed is not None and closed.reason == "complete"
    assert closed.close["closed_at"] == "2026-01-01T00:00:10.000Z"
    closed, _ = outcome([open_msg(contract="strict"), receipt("a", 2), receipt("b", 10.001)])
    assert closed is not None and closed.reason == "timeout"
    assert [reason for _, reason in closed.late] == ["after_deadline"]


def test_fail_fast_closes_when_every_required_branch_reported() -> None:
    closed, _ = outcome([open_msg(contract="fast"), receipt("a", 1, status="error", error="x"),
                         receipt("b", 3)])
    assert closed is not None and closed.reason == "timeout"
    assert closed.close["closed_at"] == "2026-01-01T00:00:03.000Z"
    assert closed.close["failed"] == ["a"]


def test_non_monotone_a_later_conflict_does_not_undo_an_earlier_close() -> None:
    closed, _ = outcome([open_msg(contract="strict"), receipt("a", 1), receipt("b", 2),
                         receipt("a", 3, value="changed")])
    assert closed is not None and closed.reason == "complete"
    assert closed.close["closed_at"] == "2026-01-01T00:00:02.000Z"


def test_non_monotone_a_retry_clears_a_conflict_later() -> None:
    closed, _ = outcome([open_msg(contract="strict"), receipt("a", 1, value=1),
                         receipt("a", 1.5, value=2), receipt("b", 2),
                         receipt("a", 4, attempt=2, value=3)])
    assert closed is not None and closed.reason == "complete"
    assert closed.close["closed_at"] == "2026-01-01T00:00:04.000Z"
    assert closed.close["counts"]["superseded"] == 2


def test_receipts_before_the_open_count_at_opened_at() -> None:
    closed, _ = outcome([receipt("a", 1), receipt("b", 2), open_msg(at=5, contract="strict")])
    assert closed is not None and closed.reason == "complete"
    assert closed.close["closed_at"] == closed.close["opened_at"] == "2026-01-01T00:00:05.000Z"
    assert closed.close["latency_ms"] == 0


def test_undefined_join_goes_to_dead_letter_and_later_messages_start_afresh() -> None:
    closed, rejected = outcome([receipt("a", 0), receipt("b", 5),
                                open_msg(at=40, required=["a"]), receipt("a", 41)])
    assert len(rejected) == 2
    assert closed is not None and closed.reason == "complete"
    assert closed.close["opened_at"] == "2026-01-01T00:00:40.000Z"


def test_undefined_join_with_no_later_messages() -> None:
    closed, rejected = outcome([receipt("a", 0), receipt("a", 1)])
    assert closed is None and len(rejected) == 2


def test_horizon_watermark_trigger_waits_and_eager_does_not() -> None:
    catalog = make_catalog()
    watch = records([open_msg(contract="watch"), receipt("a", 1), receipt("b", 2)], catalog)
    assert decide(watch, catalog, horizon=0) == Pending(parse_rfc3339("2026-01-01T00:00:02Z"))
    done = decide(watch, catalog, horizon=parse_rfc3339("2026-01-01T00:00:02Z"))
    assert isinstance(done, Closed) and done.reason == "complete"
    eager = records([open_msg(contract="strict"), receipt("a", 1), receipt("b", 2)], catalog)
    assert isinstance(decide(eager, catalog, horizon=0), Closed)


def test_a_definition_moved_behind_its_records_closes_eagerly_without_the_horizon() -> None:
    """docs/spec.md §2 step 2 under §4's eager trigger: a and b name ``triage`` (which needs
    other branches), x names ``strict``, the least name, which moves ``D`` (11 s) before x
    (15 s); the close under it is found among the records received (complete at 2 s), so an
    eager join closes at once. It waited for the horizon to pass 15 s, as a watermark join
    does; a close at ``D`` (nothing closable among what was received) still waits."""
    def received(*branches: str) -> list[Record]:
        return records([*(receipt(b, 1 + i, contract="triage") for i, b in enumerate(branches)),
                        receipt("x", 15, contract="strict")], catalog)
    catalog = make_catalog()
    eager = decide(received("a", "b"), catalog, horizon=0)
    assert isinstance(eager, Closed) and eager.reason == "complete"
    assert eager.close["closed_at"] == ts(2) and eager.close["counts"]["messages"] == 2
    assert [reason for _, reason in eager.late] == ["after_deadline"]
    assert decide(received("a"), catalog, horizon=0) == Pending(parse_rfc3339(ts(15)))
    catalog = make_catalog(close_trigger="watermark")
    assert decide(received("a", "b"), catalog, horizon=0) == Pending(parse_rfc3339(ts(15)))
    assert decide(received("a", "b"), catalog, horizon=parse_rfc3339(ts(15))) == eager


def test_deadline_needs_the_horizon() -> None:
    catalog = make_catalog()
    recs = records([open_msg(contract="strict"), receipt("a", 1)], catalog)
    deadline = parse_rfc3339("2026-01-01T00:00:10Z")
    assert decide(recs, catalog, horizon=deadline - 1) == Pending(deadline)
    assert isinstance(decide(recs, catalog, horizon=deadline), Closed)


def test_defaults_apply_where_nothing_else_says() -> None:
    closed, _ = outcome([open_msg(required=["a"]), receipt("b", 1)], deadline_s=5,
                        allow_partial=True)
    assert closed is not None and closed.reason == "partial"
    assert closed.close["deadline"] == "2026-01-01T00:00:05.000Z"


def test_a_pruned_branch_that_reports_is_keyed_by_its_reports_not_its_skip() -> None:
    """docs/spec.md §5: the key of ``pruned_branch_reported`` is the least key of the pruned
    branch's reports; the skip that pruned it (keyed by the branch's name) is not one."""
    closed, _ = outcome([open_msg(contract="strict"), receipt("b", 1, status="skipped"),
                         receipt("b", 2, key="bk"), receipt("a", 3)])
    assert closed is not None
    assert closed.close["pruned"] == ["b"]
    assert [(c["kind"], c["branch"], c["key"]) for c in closed.close["conflicts"]] \
        == [("pruned_branch_reported", "b", "bk")]


def test_the_specs_example_of_a_definition_over_time() -> None:
    """Contract ``strict`` (required a, b; ``deadline_s`` 10): receipt a at 00:00 without a
    contract, receipt b at 00:20 naming it. At 00:20 the definition gives D = 00:10, before
    b: the join closes ``timeout`` at 00:10 holding a, and b is late ``after_deadline``."""
    closed, rejected = outcome([receipt("a", 0), receipt("b", 20, contract="strict")])
    assert closed is not None and rejected == []
    assert (closed.reason, closed.close["closed_at"], closed.close["deadline"]) \
        == ("timeout", ts(10), ts(10))
    assert closed.close["counts"]["messages"] == 1
    assert [(record[R.R_BRANCH], reason) for record, reason in closed.late] \
        == [("b", "after_deadline")]


def test_a_message_that_moves_the_deadline_exactly_to_its_own_time_is_in_the_close() -> None:
    """a and b arrive with no definition at 0 s; a copy of a at 10 s names ``strict`` (D =
    opened_at + 10 s = 10 s, its own time). D is not before it, so the walk goes on (§2, step
    3) and the join closes at 10 s holding all three: a message at exactly D is included.
    Taken as moved behind it, the join closed at 0 s and the copy was late."""
    closed, _ = outcome([receipt("a", 0), receipt("b", 0), receipt("a", 10, contract="strict")])
    assert closed is not None and closed.reason == "complete"
    assert closed.close["closed_at"] == "2026-01-01T00:00:10.000Z" and closed.late == []
    assert closed.close["counts"]["messages"] == 3


def test_a_deadline_capped_at_year_9999_gives_the_latency_to_the_cap() -> None:
    """D = opened_at + deadline_s is capped at 9999-12-31T23:59:59.999Z (§2): an open 10 s
    before it with ``deadline_s`` 30 times out at the cap, 9,999 ms after it opened."""
    opened = "9999-12-31T23:59:50.000Z"
    closed, _ = outcome([{"kind": "open", "join_id": "j", "opened_at": opened,
                          "required": ["a"], "deadline_s": 30}])
    assert closed is not None and closed.reason == "timeout"
    assert closed.close["closed_at"] == closed.close["deadline"] == "9999-12-31T23:59:59.999Z"
    assert closed.close["latency_ms"] == 9_999
