"""Closes a stream finds only once the watermark passes a time (docs/spec.md §4): a ``D``
that a message moves behind its own time, and the fresh join after an undefined one. Both
are decided over what the join holds by then, as the bounded run decides, where an eager
close of a live join is final on arrival."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fanin.cli import main

CONTRACTS = """contracts:
  - name: c10
    required: [a, b]
    deadline_s: 10
  - name: a3
    required: [a, b]
    deadline_s: 3
"""


def _receipt(branch: str, seconds: float, **fields: Any) -> str:
    at = f"2026-01-01T00:00:{seconds:06.3f}Z"
    return json.dumps({"join_id": "j", "branch": branch, "status": "ok", "event_time": at,
                       **fields})


def _run(tmp_path: Path, name: str, lines: list[str], *args: str) -> dict[str, list[Any]]:
    (tmp_path / "c.yaml").write_text(CONTRACTS)
    source = tmp_path / f"{name}.jsonl"
    source.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / name
    assert main(["run", "--input", str(source), "--contracts", str(tmp_path / "c.yaml"),
                 "--output", str(out), *args]) == 0
    return {kind: [json.loads(line) for path in sorted((out / kind).glob("*.jsonl"))
                   for line in path.read_text().splitlines()]
            for kind in ("closes", "late", "dead_letter")}


def test_a_deadline_a_receipt_moves_behind_itself_is_decided_as_the_bounded_run_does(
        tmp_path: Path) -> None:
    """a@0 names c10 (D 00:10); b@5 names a3, the least name, so D is 00:03, behind b; the
    error of b@2.5 that follows it in the file is in the timeout at 00:03, as in the bounded
    run (it was read as late ``after_close`` for coming after b@5)."""
    lines = [_receipt("a", 0, value=1, contract="c10"), _receipt("b", 5, value=2, contract="a3"),
             json.dumps({"join_id": "j", "branch": "b", "status": "error", "error": "e",
                         "event_time": "2026-01-01T00:00:02.500Z"})]
    replay = _run(tmp_path, "replay", lines, "--replay", "--max-disorder-s", "0",
                  "--close-trigger", "watermark")
    assert replay == _run(tmp_path, "bounded", lines)
    [close] = replay["closes"]
    assert (close["reason"], close["closed_at"], close["failed"], close["counts"]["messages"]) \
        == ("timeout", "2026-01-01T00:00:03.000Z", ["b"], 2)
    assert [(late["reason"], late["message"]["event_time"]) for late in replay["late"]] == \
        [("after_deadline", "2026-01-01T00:00:05.000Z")]


def test_the_fresh_join_after_an_undefined_one_starts_when_the_watermark_passes_its_d(
        tmp_path: Path) -> None:
    """b@0 alone is undefined at 00:03 (``--deadline-s 3``, no contract); a@4 naming c10 and
    b@5 start the fresh join, which waits for that decision and then closes ``complete`` at
    00:05 with a@5, of that millisecond, in it as a duplicate. Without b@0 the same lines
    close on b@5's arrival (eager) and a@5 is late ``after_close``."""
    fresh = [_receipt("a", 4, value=1, contract="c10"), _receipt("b", 5, value=2),
             _receipt("a", 5, value=1)]
    args = ("--replay", "--max-disorder-s", "0", "--close-trigger", "eager", "--deadline-s", "3")
    after_undefined = _run(tmp_path, "after", [_receipt("b", 0, value=2), *fresh], *args)
    assert [d["error"] for d in after_undefined["dead_letter"]] == ["undefined_join"]
    [close] = after_undefined["closes"]
    assert (close["reason"], close["closed_at"], close["counts"]) == (
        "complete", "2026-01-01T00:00:05.000Z",
        {"messages": 3, "duplicates": 1, "superseded": 0})
    assert after_undefined["late"] == []
    alone = _run(tmp_path, "alone", fresh, *args)
    assert [c["counts"]["messages"] for c in alone["closes"]] == [2]
    assert [late["reason"] for late in alone["late"]] == ["after_close"]
