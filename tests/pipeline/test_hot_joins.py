"""Abusive join shapes through the whole pipeline, bounded and replay (docs/spec.md §4, §5).

(a) a looping agent: one join receives far more receipts than ``max_messages_per_join``;
(b) many joins that never complete: each ends by its deadline, and tombstones expire after
    ``retention_s`` (a contracts file with a small ``retention_s``);
(c) one join whose receipts are spread over days (deadline in days) among short joins.
Every run also checks exact conservation (docs/spec.md §5, "nothing is lost").
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fanin.contracts.catalog import JoinDefaults
from fanin.contracts.timefmt import format_ms, parse_rfc3339
from fanin.pipelines.pipeline import RunConfig, run_pipeline

KINDS = ("closes", "late", "dead_letter")
T0 = parse_rfc3339("2026-01-01T00:00:00Z")
DAY_MS = 86_400_000
CONTRACTS = """
contracts:
  - name: loop
    required: [a, b]
    deadline_s: 60
  - name: expiring
    required: [a, b]
    deadline_s: 10
    retention_s: 5
  - name: lasting
    required: [a, b]
    deadline_s: 10
  - name: slow
    required: [plan, build, review]
    deadline_s: 259200
  - name: quick
    required: [x]
    deadline_s: 5
"""


def line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


def open_line(join_id: str, at_ms: int, contract: str) -> str:
    return line({"kind": "open", "join_id": join_id, "opened_at": format_ms(at_ms),
                 "contract": contract})


def receipt_line(join_id: str, branch: str, at_ms: int, **extra: Any) -> str:
    return line({"join_id": join_id, "branch": branch, "status": "ok",
                 "event_time": format_ms(at_ms), **extra})


@pytest.fixture(scope="module")
def contracts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("contracts") / "contracts.yaml"
    path.write_text(CONTRACTS)
    return str(path)


def run(tmp: Path, name: str, lines: list[str], contracts: str, **config: Any
        ) -> dict[str, list[dict[str, Any]]]:
    """Write ``lines`` (file order = arrival order), run, read outputs, check conservation."""
    src = tmp / f"{name}.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp / f"{name}-out"
    run_pipeline(RunConfig(output=str(out), inputs=[str(src)], contracts_path=contracts,
                           **config), [])
    found = {kind: [json.loads(x) for f in sorted((out / kind).glob("*.jsonl"))
                    for x in f.read_text().splitlines()] for kind in KINDS}
    folded = sum(c["counts"]["messages"] for c in found["closes"])
    assert folded + len(found["late"]) + len(found["dead_letter"]) == len(lines)
    return found


MODES = [pytest.param({}, id="bounded"), pytest.param({"replay": True}, id="replay")]


# ----------------------------------------------------------------------------- (a) looping
@pytest.mark.parametrize("mode", MODES)
def test_looping_agent_overflow_goes_to_dead_letter(tmp_path: Path, contracts: str,
                                                    mode: dict[str, Any]) -> None:
    limit, loops = 50, 200
    lines = [open_line("hot", T0, "loop")] + [
        receipt_line("hot", "a", T0 + 100 * i, attempt=1 + i % 3, value="same")
        for i in range(loops)]
    found = run(tmp_path, "loop", lines, contracts, max_messages_per_join=limit, **mode)
    (close,) = found["closes"]
    assert close["join_id"] == "hot" and close["reason"] == "timeout"
    assert close["counts"]["messages"] == limit and close["missing"] == ["b"]
    overflow = found["dead_letter"]
    assert len(overflow) == len(lines) - limit
    assert {d["error"] for d in overflow} == {"join_too_large"}
    # exactly the overflow: the messages after the first ``limit`` (arrival = event time order)
    assert sorted(d["raw"] for d in overflow) == sorted(lines[limit:])
    assert found["late"] == []


@pytest.mark.parametrize("mode", MODES)
def test_hot_join_does_not_disturb_its_neighbours(tmp_path: Path, contracts: str,
                                                  mode: dict[str, Any]) -> None:
    lines: list[str] = []
    for i in range(120):
        lines.append(receipt_line("hot", "a", T0 + 10 * i, contract="loop", value=i))
        if i % 12 == 0:
            n = i // 12
            lines += [open_line(f"calm-{n}", T0 + 10 * i, "loop"),
                      receipt_line(f"calm-{n}", "a", T0 + 10 * i),
                      receipt_line(f"calm-{n}", "b", T0 + 10 * i + 1)]
    found = run(tmp_path, "neighbours", lines, contracts, max_messages_per_join=30, **mode)
    reasons = {c["join_id"]: c["reason"] for c in found["closes"]}
    assert reasons.pop("hot") == "timeout"
    assert set(reasons.values()) == {"complete"} and len(reasons) == 10
    assert Counter(d["error"] for d in found["dead_letter"]) == {"join_too_large": 90}


# ----------------------------------------------------------------------------- (b) deadlines
def _never_complete(contract: str, joins: int = 150) -> list[str]:
    lines = []
    for j in range(joins):
        at = T0 + 200 * j
        lines += [open_line(f"w{j:04d}", at, contract), receipt_line(f"w{j:04d}", "a", at + 50)]
    return lines


@pytest.mark.parametrize("mode", MODES)
def test_many_joins_end_by_their_deadline(tmp_path: Path, contracts: str,
                                          mode: dict[str, Any]) -> None:
    undefined = [receipt_line(f"u{j:03d}", "a", T0 + 300 * j) for j in range(30)]
    lines = sorted(_never_complete("lasting") + undefined,
                   key=lambda x: json.loads(x).get("event_time") or json.loads(x)["opened_at"])
    found = run(tmp_path, "deadlines", lines, contracts, **mode)
    assert len(found["closes"]) == 150
    for close in found["closes"]:
        assert close["reason"] == "timeout" and close["missing"] == ["b"]
        assert close["closed_at"] == close["deadline"]
        assert parse_rfc3339(close["deadline"]) - parse_rfc3339(close["opened_at"]) == 10_000
    assert Counter(d["error"] for d in found["dead_letter"]) == {"undefined_join": 30}


@pytest.mark.parametrize(("contract", "straggler_is"), [
    ("expiring", "dead_letter"), ("lasting", "late")])
def test_tombstones_expire_after_retention(tmp_path: Path, contracts: str, contract: str,
                                           straggler_is: str) -> None:
    # a short join half an hour later moves the watermark past every deadline + 5 s; then
    # the last line reaches join w0000 an hour after its deadline: within the default
    # retention it is recognised (late); after retention_s=5 the tombstone is gone, so it
    # starts a fresh join, which has no definition (undefined_join)
    lines = _never_complete(contract, joins=40)
    lines += [open_line("filler", T0 + 1_800_000, "quick"),
              receipt_line("filler", "x", T0 + 1_800_000)]
    lines.append(receipt_line("w0000", "b", T0 + 3_600_000))
    found = run(tmp_path, f"expiry-{contract}", lines, contracts, replay=True)
    reasons = Counter(c["reason"] for c in found["closes"])
    assert reasons == {"timeout": 40, "complete": 1}
    if straggler_is == "late":
        assert found["dead_letter"] == []
        (late,) = found["late"]
        assert late["join_id"] == "w0000" and late["reason"] == "after_deadline"
    else:
        assert found["late"] == []
        (dead,) = found["dead_letter"]
        assert dead["error"] == "undefined_join" and dead["raw"] == lines[-1]


# ----------------------------------------------------------------------------- (c) days
WATERMARK = pytest.param({"replay": True, "defaults": JoinDefaults(close_trigger="watermark")},
                         id="watermark")


@pytest.mark.parametrize("mode", [*MODES, WATERMARK])
def test_join_spread_over_days(tmp_path: Path, contracts: str, mode: dict[str, Any]) -> None:
    events = [(T0, open_line("long", T0, "slow")),
              (T0 + 3_600_000, receipt_line("long", "plan", T0 + 3_600_000)),
              (T0 + DAY_MS, receipt_line("long", "build", T0 + DAY_MS)),
              (T0 + 2 * DAY_MS + 7, receipt_line("long", "review", T0 + 2 * DAY_MS + 7)),
              (T0 + 4 * DAY_MS, receipt_line("long", "plan", T0 + 4 * DAY_MS, attempt=2))]
    for hour in range(0, 96, 6):  # short joins every six hours move the watermark by days
        at = T0 + hour * 3_600_000 + 1
        events += [(at, open_line(f"q{hour}", at, "quick")),
                   (at + 1, receipt_line(f"q{hour}", "x", at + 1))]
    lines = [text for _, text in sorted(events)]
    found = run(tmp_path, "days", lines, contracts, **mode)
    closes = {c["join_id"]: c for c in found["closes"]}
    long = closes.pop("long")
    assert long["reason"] == "complete" and long["counts"]["messages"] == 4
    assert long["closed_at"] == format_ms(T0 + 2 * DAY_MS + 7)
    assert long["latency_ms"] == 2 * DAY_MS + 7
    assert long["deadline"] == format_ms(T0 + 3 * DAY_MS)
    assert len(closes) == 16 and {c["reason"] for c in closes.values()} == {"complete"}
    (late,) = found["late"]
    assert late["join_id"] == "long" and late["reason"] == "after_deadline"


def test_loop_after_complete_is_late_in_batch_and_stream(tmp_path: Path, contracts: str) -> None:
    lines = [open_line("hot", T0, "loop"), receipt_line("hot", "a", T0 + 1),
             receipt_line("hot", "b", T0 + 2)] + [
        receipt_line("hot", "a", T0 + 100 * i + 10, value="same") for i in range(100)]
    watermark = JoinDefaults(close_trigger="watermark")
    batch = run(tmp_path, "after-b", lines, contracts, max_messages_per_join=20)
    stream = run(tmp_path, "after-w", lines, contracts, max_messages_per_join=20,
                 replay=True, defaults=watermark)
    assert stream["dead_letter"] == [] and len(stream["late"]) == 100  # the stream's answer
    assert len(batch["late"]) == len(stream["late"])
    assert batch["dead_letter"] == stream["dead_letter"]


def test_overflow_never_drops_the_open(tmp_path: Path, contracts: str) -> None:
    lines = [open_line("hot", T0, "loop")] + [
        line({"join_id": "hot", "branch": "a", "status": "ok", "event_time": format_ms(T0)})
        for _ in range(60)]
    for mode in MODES:
        found = run(tmp_path, f"tie-{mode.id}", lines, contracts, max_messages_per_join=20,
                    **mode.values[0])
        assert len(found["closes"]) == 1, mode.id
        assert {d["error"] for d in found["dead_letter"]} == {"join_too_large"}, mode.id
