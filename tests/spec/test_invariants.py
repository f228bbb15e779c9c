"""The run invariants (tests/spec/invariants.py): the checker catches each broken invariant, the
reference gives the expected answers, and every run mode keeps the invariants on
the cases (a close after its deadline; a close holding messages after its closed_at)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from spec.invariants import check_run
from spec.reference import Env, Refused, read_contracts, read_message, reference_outputs
from spec.runs import bounded_run, replay_run

CONTRACTS_YAML = """\
contracts:
  - name: fleet
    required: [b0, b1]
    optional: [o0]
    deadline_s: 10
    allow_partial: true
  - name: short
    required: [a, b]
    deadline_s: 10
  - name: plain
    required: [a, b]
"""
ENV = Env(CONTRACTS_YAML)


def _lines(*messages: dict[str, Any]) -> list[str]:
    return [json.dumps(m) for m in messages]


# docs/spec.md §2 "Definition over time"; each case is one join.
ISSUE_CASES = {
    # the only receipt carries the definition and comes after D: no message in the close
    "j1": _lines({"join_id": "j1", "branch": "o0", "key": "o0", "status": "ok", "value": 1,
                  "event_time": "2026-12-02T10:04:33.341Z",
                  "opened_at": "2026-12-02T10:04:20.679Z", "contract": "fleet"}),
    # a skip without opened_at/contract first, the receipts naming the contract after D
    "j2": _lines({"join_id": "j2", "branch": "o0", "status": "skipped",
                  "event_time": "2026-12-02T10:04:21.000Z"},
                 {"join_id": "j2", "branch": "b0", "status": "ok", "value": 1,
                  "event_time": "2026-12-02T10:04:32.000Z", "contract": "fleet"},
                 {"join_id": "j2", "branch": "b1", "status": "ok", "value": 2,
                  "event_time": "2026-12-02T10:04:33.000Z", "contract": "fleet"}),
    # receipt b names the contract after its deadline: timeout at D holding a
    "j3": _lines({"join_id": "j3", "branch": "a", "status": "ok",
                  "event_time": "2026-01-01T00:00:00Z", "value": 1},
                 {"join_id": "j3", "contract": "short", "branch": "b", "status": "ok",
                  "event_time": "2026-01-01T00:00:20Z", "value": 2}),
    # a later receipt carries an earlier opened_at, moving D behind itself
    "j4": _lines({"join_id": "j4", "contract": "plain", "branch": "a", "status": "ok",
                  "event_time": "2026-01-01T00:00:05Z", "value": 1},
                 {"join_id": "j4", "branch": "b", "status": "ok", "value": 2,
                  "event_time": "2026-01-01T00:00:32Z", "opened_at": "2026-01-01T00:00:00Z"}),
}
ALL_CASES = [line for lines in ISSUE_CASES.values() for line in lines]


def test_reference_gives_the_issue_answers() -> None:
    found = reference_outputs(ALL_CASES, ENV)
    closes = {c["join_id"]: c for c in found["closes"]}
    late = {(x["join_id"], x["message"].get("branch")): x["reason"] for x in found["late"]}
    assert (closes["j1"]["reason"], closes["j1"]["closed_at"], closes["j1"]["counts"]) == \
        ("partial", "2026-12-02T10:04:30.679Z",
         {"messages": 0, "duplicates": 0, "superseded": 0})
    assert late["j1", "o0"] == "after_deadline"
    assert closes["j2"]["closed_at"] == "2026-12-02T10:04:31.000Z"  # the skip's time + 10 s
    assert closes["j2"]["counts"]["messages"] == 1
    assert late["j2", "b0"] == late["j2", "b1"] == "after_deadline"
    assert (closes["j3"]["reason"], closes["j3"]["closed_at"], closes["j3"]["values"]) == \
        ("timeout", "2026-01-01T00:00:10.000Z", {"a": 1})
    assert late["j3", "b"] == "after_deadline"
    assert (closes["j4"]["reason"], closes["j4"]["closed_at"], closes["j4"]["deadline"]) == \
        ("timeout", "2026-01-01T00:00:30.000Z", "2026-01-01T00:00:30.000Z")
    assert late["j4", "b"] == "after_deadline"
    check_run(ALL_CASES, found)


@pytest.mark.parametrize("mode", ["bounded", "replay-watermark", "replay-eager"])
def test_issue_cases_keep_the_invariants(mode: str, tmp_path: Path) -> None:
    if mode == "bounded":
        found = bounded_run(ALL_CASES, tmp_path, CONTRACTS_YAML, ENV)
    else:
        found = replay_run(ALL_CASES, tmp_path, CONTRACTS_YAML, ENV,
                           trigger=mode.removeprefix("replay-"))
    check_run(ALL_CASES, found, eager=mode == "replay-eager")


# ------------------------------------------------------------------ the checker catches...
RUN = [*_lines(
    {"kind": "open", "join_id": "k", "opened_at": "2026-01-01T00:00:00Z", "contract": "short"},
    {"join_id": "k", "branch": "a", "status": "ok", "event_time": "2026-01-01T00:00:02Z"},
    {"join_id": "k", "branch": "b", "status": "ok", "event_time": "2026-01-01T00:00:04Z"},
    {"join_id": "k", "branch": "b", "status": "ok", "event_time": "2026-01-01T00:00:06Z",
     "value": 3},
    {"join_id": "k", "branch": "a", "status": "ok", "event_time": "2026-01-01T00:00:12Z"},
), "not json"]


@pytest.fixture
def good() -> dict[str, list[dict[str, Any]]]:
    found = reference_outputs(RUN, ENV)
    (close,) = found["closes"]
    assert close["closed_at"] == "2026-01-01T00:00:04.000Z" and len(found["late"]) == 2
    check_run(RUN, found)
    return found


def _broken(good: dict[str, list[dict[str, Any]]], how: str) -> dict[str, list[dict[str, Any]]]:
    found = copy.deepcopy(good)
    close = found["closes"][0]
    if how == "closed after deadline":
        close["closed_at"], close["latency_ms"] = "2026-01-01T00:00:11.000Z", 11000
    elif how == "counted after closed_at":  # the 00:04 receipt counted, closed at 00:03
        close["closed_at"], close["latency_ms"] = "2026-01-01T00:00:03.000Z", 3000
    elif how == "late before closed_at":  # the 00:06 receipt late, yet closed at 00:08
        close["closed_at"], close["latency_ms"] = "2026-01-01T00:00:08.000Z", 8000
    elif how == "lost":
        found["late"].pop()
    elif how == "counted twice":
        close["counts"]["messages"] += 1
    elif how == "dead letter of no input":
        found["dead_letter"].append({"error": "invalid_json", "raw": "other"})
    elif how == "wrong late reason":
        for late in found["late"]:
            late["reason"] = "after_close"
    return found


@pytest.mark.parametrize("how", ["closed after deadline", "counted after closed_at",
                                 "late before closed_at", "lost", "counted twice",
                                 "dead letter of no input", "wrong late reason"])
def test_checker_catches(good: dict[str, list[dict[str, Any]]], how: str) -> None:
    with pytest.raises(AssertionError):
        check_run(RUN, _broken(good, how))


def test_eager_allows_late_lines_before_closed_at(good: dict[str, list[dict[str, Any]]]
                                                  ) -> None:
    broken = _broken(good, "late before closed_at")
    check_run(RUN, broken, eager=True)
    with pytest.raises(AssertionError, match="event time <= closed_at"):
        check_run(RUN, broken)


CORPUS = sorted((Path(__file__).resolve().parents[1] / "data" / "fuzz_corpus").glob("*.bin"))


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in CORPUS])
def test_the_reference_reads_the_parse_corpus_as_named(path: Path) -> None:
    """The reference's own reading of docs/spec.md §1 gives each input of the parse's fuzz
    corpus (``<outcome>--<label>.bin``, contracts ``triage`` and ``review``) its outcome."""
    contracts = read_contracts("contracts: [{name: triage}, {name: review}]")
    try:
        read_message(1, path.read_bytes(), contracts)
        outcome = "ok"
    except Refused as exc:
        outcome = exc.args[0]
    assert outcome == path.stem.split("--", 1)[0]
