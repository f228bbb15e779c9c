"""docs/spec.md §2-3: the reducer's rules, order independence and idempotence (hypothesis)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.builders import make_catalog, open_msg, receipt, records

from fanin.core.bounded import bounded_outputs
from fanin.core.close import close_object
from fanin.core.reducer import JoinReducer


def close_of(messages: list[dict[str, Any]], **defaults: Any) -> dict[str, Any]:
    catalog = make_catalog(**defaults)
    outputs = list(bounded_outputs(records(messages, catalog), catalog, 100_000, 2**30))
    closes = [obj for kind, obj in outputs if kind == "closes"]
    assert len(closes) == 1 and all(kind != "dead_letter" for kind, _ in outputs), outputs
    return closes[0]


def reduce_all(messages: list[dict[str, Any]]) -> JoinReducer:
    catalog = make_catalog()
    reducer = JoinReducer(catalog)
    for rec in records(messages, catalog):
        reducer.add(rec)
    return reducer


def kinds(close: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(c["kind"], c["branch"]) for c in close["conflicts"]]


# --- the three articles' examples ---------------------------------------------------------

def test_retrieve_verify_rank_agreeing_answers_complete() -> None:
    close = close_of([
        open_msg(contract="triage"),
        receipt("retrieve", 1, key="answer", value="use cached policy"),
        receipt("verify", 2, key="answer", value="use cached policy"),
        receipt("rank", 3, key="score", value=0.91),
    ])
    assert close["reason"] == "complete"
    assert close["closed_at"] == "2026-01-01T00:00:03.000Z"
    assert close["values"] == {"answer": "use cached policy", "score": 0.91}
    assert close["conflicts"] == []


def test_retrieve_verify_rank_disagreeing_answers_are_a_key_conflict() -> None:
    close = close_of([
        open_msg(contract="triage"),
        receipt("retrieve", 1, key="answer", value="use cached policy"),
        receipt("verify", 2, key="answer", value="refresh the policy"),
        receipt("rank", 3, key="score", value=0.91),
    ])
    assert close["reason"] == "partial"  # triage allows partial; the conflict blocks complete
    assert close["closed_at"] == close["deadline"]
    assert kinds(close) == [("key_conflict", "retrieve"), ("key_conflict", "verify")]
    assert "answer" not in close["values"] and close["values"]["score"] == 0.91


def test_conditional_route_skipped_completes_instead_of_hanging() -> None:
    graph = [
        open_msg(contract="routed"),
        receipt("classify", 1, value="simple"),
        receipt("answer", 3, value="42"),
    ]
    close = close_of([*graph, receipt("review", 2, status="skipped")])
    assert close["reason"] == "complete"
    assert close["pruned"] == ["review/legal", "review/tech"]
    assert close["closed_at"] == "2026-01-01T00:00:03.000Z"
    without_skip = close_of(graph)
    assert without_skip["reason"] == "timeout"
    assert without_skip["missing"] == ["review/legal", "review/tech"]


def test_adk_style_fan_out_aggregates_values_by_branch_name() -> None:
    close = close_of([
        open_msg(required=["make_uppercase", "count_characters", "reverse_string"]),
        receipt("make_uppercase", 1, value="HELLO"),
        receipt("count_characters", 1, value=5),
        receipt("reverse_string", 1, value="olleh"),
    ])
    assert close["reason"] == "complete"
    assert close["values"] == {"count_characters": 5, "make_uppercase": "HELLO",
                               "reverse_string": "olleh"}


# --- rules --------------------------------------------------------------------------------

def test_attempts_supersede_and_a_retry_clears_an_error() -> None:
    close = close_of([
        open_msg(contract="strict"),
        receipt("a", 1, status="error", error="boom"),
        receipt("a", 2, attempt=2, value=1),
        receipt("b", 3, value=2),
    ])
    assert close["reason"] == "complete"
    assert close["branches"]["a"]["attempt"] == 2
    assert close["counts"] == {"messages": 4, "duplicates": 0, "superseded": 1}


def test_changed_duplicate_is_a_conflict_and_the_branch_has_no_current_receipt() -> None:
    close = close_of([
        open_msg(contract="strict"),
        receipt("a", 1, value=1),
        receipt("a", 2, value=2),
        receipt("b", 3, value=2),
    ])
    assert close["reason"] == "timeout"
    assert kinds(close) == [("duplicate_changed", "a")]
    assert close["missing"] == ["a"] and "a" not in close["branches"]


def test_identical_content_is_a_duplicate_even_with_other_event_time_and_ids() -> None:
    close = close_of([
        open_msg(contract="strict"),
        receipt("a", 1, value={"x": 1, "y": [1, 2]}, message_id="m1"),
        receipt("a", 1.5, value={"y": [1.0, 2], "x": 1.0}, message_id="m2", run_id="r"),
        receipt("b", 2, value=True),
    ])
    assert close["reason"] == "complete"
    assert close["counts"]["duplicates"] == 1
    assert close["branches"]["a"]["event_time"] == "2026-01-01T00:00:01.000Z"


def test_true_is_not_one_for_key_conflicts() -> None:
    close = close_of([
        open_msg(required=["a", "b"]),
        receipt("a", 1, key="k", value=True),
        receipt("b", 1, key="k", value=1),
    ])
    assert kinds(close) == [("key_conflict", "a"), ("key_conflict", "b")]
    equal = close_of([
        open_msg(required=["a", "b"]),
        receipt("a", 1, key="k", value=1),
        receipt("b", 1, key="k", value=1.0),
    ])
    assert equal["reason"] == "complete" and equal["values"] == {"k": 1}


def test_unknown_and_pruned_branch_reports_are_conflicts() -> None:
    close = close_of([
        open_msg(contract="routed"),
        receipt("classify", 1),
        receipt("answer", 1),
        receipt("review", 1, status="skipped"),
        receipt("review/legal", 1, value="late work"),
        receipt("stray", 1),
        receipt("nothing/here", 1, status="skipped"),
    ])
    assert kinds(close) == [("pruned_branch_reported", "review/legal"),
                            ("unknown_branch", "nothing/here"), ("unknown_branch", "stray")]
    assert close["reason"] == "timeout"


def test_an_undeclared_path_skipped_and_reported_is_one_conflict() -> None:
    """docs/spec.md §3: one entry per branch, its key the least of its receipts' and skips'."""
    close = close_of([
        open_msg(required=["a"]),
        receipt("zz", 1, status="skipped"),
        receipt("zz", 2, key="k", value=1),
        receipt("a", 3),
    ])
    assert close["conflicts"] == [{"kind": "unknown_branch", "branch": "zz", "key": "k"}]
    assert close["reason"] == "timeout"


def test_skip_duplicates_and_skip_outside_attempt_rules() -> None:
    reducer = reduce_all([
        open_msg(contract="routed"),
        receipt("review/tech", 1, status="skipped", attempt=3),
        receipt("review/tech", 2, status="skipped", attempt=1),
        receipt("review/legal", 1, status="skipped"),
        receipt("classify", 1), receipt("answer", 1),
    ])
    assert reducer.complete()
    close = close_object(reducer, 2000, "complete")
    assert close["counts"]["duplicates"] == 1 and close["counts"]["superseded"] == 0


def test_schema_violation_blocks_completion_and_keeps_value_out() -> None:
    close = close_of([
        open_msg(contract="triage"),
        receipt("retrieve", 1, key="answer", value="a"),
        receipt("verify", 1, key="answer", value="a"),
        receipt("rank", 1, key="score", value=1.5),
    ])
    assert kinds(close) == [("schema_violation", "rank")]
    assert "score" not in close["values"] and close["branches"]["rank"]["value"] == 1.5


def test_schemas_come_from_the_contract_even_when_the_open_overrides() -> None:
    close = close_of([
        open_msg(contract="triage", required=["rank"]),
        receipt("rank", 1, key="score", value=-1, contract="triage"),
    ])
    assert kinds(close) == [("schema_violation", "rank")]


def test_open_conflict_and_contract_conflict() -> None:
    close = close_of([
        open_msg(at=0, contract="strict"),
        open_msg(at=1, contract="strict", deadline_s=99),
        receipt("a", 2, contract="watch"),
        receipt("b", 2),
    ])
    assert [c["kind"] for c in close["conflicts"]] == ["contract_conflict", "open_conflict"]
    assert close["contract"] == "strict"
    assert close["deadline"] == "2026-01-01T00:00:10.000Z"  # the earliest open defines it


def test_failed_and_missing_lists() -> None:
    close = close_of([
        open_msg(required=["a", "b", "c"], allow_partial=True),
        receipt("a", 1, status="timeout"),
        receipt("b", 1, status="error", error="x"),
    ])
    assert close["failed"] == ["a", "b"] and close["missing"] == ["c"]
    assert close["reason"] == "partial"


def test_receipts_name_the_contract_when_no_open_arrives() -> None:
    close = close_of([
        receipt("a", 1, contract="strict", opened_at="2026-01-01T00:00:00.500Z"),
        receipt("b", 2, contract="strict"),
    ])
    assert close["reason"] == "complete"
    assert close["opened_at"] == "2026-01-01T00:00:00.500Z"


# --- properties ---------------------------------------------------------------------------

_BRANCHES = ["a", "b", "c", "c/x", "z"]
_message = st.one_of(
    st.builds(lambda b, t, s, v, k, n: receipt(b, t, status=s, value=v, key=k, attempt=n),
              st.sampled_from(_BRANCHES), st.integers(0, 40),
              st.sampled_from(["ok", "ok", "error", "skipped"]),
              st.sampled_from([1, 1.0, 2, "x", True, None, [1], {"k": 1}]),
              st.sampled_from(["k1", "k2", "a", "b"]), st.integers(1, 3)),
    st.builds(lambda t, d: open_msg(at=t, required=["a", "b"], optional=["c"], deadline_s=d),
              st.integers(0, 5), st.sampled_from([20, 30])),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_message, min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_any_permutation_gives_the_same_close(messages: list[dict[str, Any]], rnd: Any) -> None:
    catalog = make_catalog()
    recs = records(messages, catalog)
    shuffled = list(recs)
    rnd.shuffle(shuffled)
    def canonical(outputs: list[tuple[str, dict[str, Any]]]) -> list[str]:
        return sorted(json.dumps(item, sort_keys=True) for item in outputs)

    assert canonical(bounded_outputs(recs, catalog, 100_000, 2**30)) == \
        canonical(bounded_outputs(shuffled, catalog, 100_000, 2**30))
    a, b = JoinReducer(catalog), JoinReducer(catalog)
    for rec in recs:
        a.add(rec)
    for rec in shuffled:
        b.add(rec)
    assert (a.complete(), a.all_reported(), a.closable()) == \
        (b.complete(), b.all_reported(), b.closable())


@settings(max_examples=150, deadline=None)
@given(st.lists(_message, min_size=2, max_size=12), st.data())
def test_redelivery_changes_only_messages_and_duplicates(messages: list[dict[str, Any]],
                                                         data: Any) -> None:
    catalog = make_catalog()
    base = [open_msg(at=0, required=["a", "b"], deadline_s=30), *messages]
    recs = records(base, catalog)
    again = data.draw(st.sampled_from(recs))
    r1, r2 = JoinReducer(catalog), JoinReducer(catalog)
    for rec in recs:
        r1.add(rec)
        r2.add(rec)
    r2.add(again)
    c1, c2 = close_object(r1, 60_000, r1.reason()), close_object(r2, 60_000, r2.reason())
    assert c2["counts"]["messages"] == c1["counts"]["messages"] + 1
    assert c2["counts"]["duplicates"] == c1["counts"]["duplicates"] + 1
    c1.pop("counts"), c2.pop("counts")
    assert c1 == c2


def test_identical_opens_are_duplicates_whatever_their_ids_and_time_spelling() -> None:
    messages = [
        open_msg(required=["b", "a"], run_id="r1", message_id="m1"),
        {**open_msg(required=["a", "b"], run_id="r2"), "opened_at": "2026-01-01T01:00:00+01:00",
         "extra": "ignored"},
        receipt("a", 1), receipt("b", 2),
    ]
    close = close_of(messages)
    assert close["reason"] == "complete" and close["conflicts"] == []
    assert close["counts"]["duplicates"] == 1
    # the least run_id among the copies of the defining open, in any order (docs/spec.md §5)
    assert close["run_id"] == "r1" == close_of(messages[::-1])["run_id"]


def test_conflicting_opens_at_one_time_the_least_canonical_json_defines() -> None:
    # canonical JSON sorts fields: ..."deadline_s":20... < ..."deadline_s":5...
    close = close_of([open_msg(required=["a"], deadline_s=5),
                      open_msg(required=["a"], deadline_s=20)])
    assert close["deadline"] == "2026-01-01T00:00:20.000Z"
    assert [c["kind"] for c in close["conflicts"]] == ["open_conflict"]


_RICH_BRANCHES = ["retrieve", "verify", "rank", "enrich", "a", "b", "c", "c/x", "review",
                  "review/legal", "zz"]
_rich_message = st.one_of(
    st.builds(lambda b, t, s, v, k, n, c: receipt(b, t, status=s, value=v, key=k, attempt=n,
                                                  **({"contract": c} if c else {})),
              st.sampled_from(_RICH_BRANCHES), st.integers(0, 40),
              st.sampled_from(["ok", "ok", "ok", "error", "timeout", "skipped"]),
              st.sampled_from([0.5, 2, 1, 1.0, "x", None, {"k": 1}]),
              st.sampled_from([None, "score", "answer", "a", "rank"]), st.integers(1, 3),
              st.sampled_from([None, None, "triage", "strict", "routed"])),
    st.builds(lambda t, req, c: open_msg(at=t, **({"required": req} if req else {}),
                                         **({"contract": c} if c else {})),
              st.integers(0, 5), st.sampled_from([None, ["a", "b"], ["c", "rank"]]),
              st.sampled_from([None, "triage", "routed"])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_rich_message, min_size=1, max_size=14))
def test_incremental_answers_equal_a_recount_after_every_message(
        messages: list[dict[str, Any]]) -> None:
    """complete / all_reported / conflict_count, kept incrementally, agree after every add
    with what the close (built from the stored records alone) shows."""
    catalog = make_catalog()
    reducer = JoinReducer(catalog)
    for rec in records(messages, catalog):
        reducer.add(rec)
        if not reducer.defined():
            assert not reducer.complete() and not reducer.all_reported()
            assert not reducer.closable()
            continue
        close = close_object(reducer, reducer.deadline(), "timeout")
        recount = (not close["missing"] and not close["failed"] and not close["conflicts"],
                   not close["missing"], len(close["conflicts"]))
        assert (reducer.complete(), reducer.all_reported(), reducer.conflict_count()) == recount


# --- which spelling of JSON-equal values a close shows (docs/spec.md §3, §5) -----------------

def test_the_close_shows_the_earliest_copy_of_a_duplicate_by_message_id_then_run_id() -> None:
    """Two copies of a's receipt at one time, JSON-equal (``1`` and ``1.0``): the close shows
    the earliest by event time, then ``message_id`` (m1), then ``run_id`` (r1 would win on
    run_id alone)."""
    close = close_of([
        open_msg(required=["a"]),
        receipt("a", 1, value=1.0, message_id="m2", run_id="r1"),
        receipt("a", 1, value=1, message_id="m1", run_id="r2"),
    ])
    assert json.dumps(close["values"]) == '{"a": 1}'
    assert json.dumps(close["branches"]["a"]["value"]) == "1"
    assert close["counts"]["duplicates"] == 1 and close["conflicts"] == []


def test_a_key_written_with_json_equal_values_shows_the_least_branch_s_spelling() -> None:
    """a writes ``k = 1``, b writes ``k = 1.0``: JSON-equal, no conflict; the value shown is
    a's (the least branch), ``1``, whichever comes first."""
    for first, second in (("a", "b"), ("b", "a")):
        values = {"a": 1, "b": 1.0}
        close = close_of([
            open_msg(required=["a", "b"]),
            receipt(first, 1, key="k", value=values[first]),
            receipt(second, 1, key="k", value=values[second]),
        ])
        assert json.dumps(close["values"]) == '{"k": 1}' and close["conflicts"] == []


def test_error_receipts_differing_in_their_error_text_are_a_changed_duplicate() -> None:
    """The content of a receipt is its status, key, value and error (docs/spec.md §3): two
    ``error`` receipts of a at one attempt saying different things are ``duplicate_changed``,
    so a ``fail_fast`` join does not close on them: it times out at D."""
    close = close_of([
        open_msg(required=["a"], fail_fast=True, deadline_s=30),
        receipt("a", 1, status="error", error="boom"),
        receipt("a", 1, status="error", error="bang"),
    ])
    assert kinds(close) == [("duplicate_changed", "a")]
    assert close["reason"] == "timeout" and close["closed_at"].endswith("00:00:30.000Z")
