"""Invariants every run must keep, checked from its inputs and its outputs alone.

``check_run(inputs, outputs, eager=...)`` raises ``AssertionError`` naming the first broken
invariant (docs/spec.md §4, §5):

- every close: ``opened_at <= closed_at <= deadline`` and ``latency_ms = closed_at - opened_at``;
- conservation: every non-blank input line is in exactly one place: one dead letter (matched
  by its exact text), one late line (matched by its message object), or counted in a close of
  its join (per join, the closes' ``counts.messages`` add up to the messages left);
- every counted message has effective event time (``max(event_time, opened_at)``)
  ``<= closed_at`` of its join's close;
- every late line of a closed join names that close's reason, says ``after_deadline`` exactly
  when its event time is after the deadline, and has an event time after ``closed_at`` —
  unless ``eager`` is set: with the eager trigger a message that *arrived* after the close is
  late even with an earlier event time (so is, with either trigger, a message that arrived
  behind the watermark), which outputs alone cannot tell apart.

A join that closed more than once (its tombstone expired) has several closes; its messages
cannot be told apart by close, so each counted message and late line must fit one of them.
"""

from __future__ import annotations

import base64
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spec.reference import epoch_ms, rfc3339

__all__ = ["KINDS", "check_run", "read_output_dir"]

KINDS = ("closes", "late", "dead_letter")


def read_output_dir(folder: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The three outputs of a run's ``--output`` folder (its ``*.jsonl`` files). Lines end at
    ``\n`` only: a value may hold U+2028 or U+0085 unescaped, where ``str.splitlines`` splits."""
    found: dict[str, list[dict[str, Any]]] = {}
    for kind in KINDS:
        found[kind] = [json.loads(line) for path in sorted((Path(folder) / kind).glob("*.jsonl"))
                       for line in path.read_text(encoding="utf-8").split("\n") if line]
    return found


def _key(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)


def _message(line: bytes) -> tuple[str, int] | None:
    """``(join_id, event time)`` of a line that is a JSON object with both, else None."""
    try:
        obj = json.loads(line)
        stamp = obj["opened_at"] if obj.get("kind") == "open" else obj["event_time"]
        return obj["join_id"], epoch_ms(stamp)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None


def _late_problem(late: dict[str, Any], time: int, close: dict[str, Any], eager: bool
                  ) -> str | None:
    """What is wrong with ``late`` (of a message at ``time``) as a late line of ``close``."""
    deadline, closed = epoch_ms(close["deadline"]), epoch_ms(close["closed_at"])
    expected = "after_deadline" if time > deadline else "after_close"
    if late["close_reason"] != close["reason"]:
        return f"late close_reason {late['close_reason']}, the close's is {close['reason']}: " \
            f"{late}"
    if late["reason"] != expected:
        return f"late reason should be {expected}: {late}"
    if not eager and time <= closed:
        return f"late line with event time <= closed_at {close['closed_at']}: {late}"
    return None


def check_run(inputs: Sequence[str | bytes], outputs: dict[str, list[dict[str, Any]]],
              eager: bool = False) -> None:
    """Assert the invariants of the module docstring for one run."""
    lines = [line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
             for line in inputs]
    lines = [line for line in lines if line]
    closes = outputs["closes"]
    by_join: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for close in closes:
        opened, closed, deadline = (epoch_ms(close[f]) for f in
                                    ("opened_at", "closed_at", "deadline"))
        assert closed <= deadline, f"closed_at after deadline: {close}"
        assert opened <= closed, f"closed_at before opened_at: {close}"
        assert close["latency_ms"] == closed - opened, f"latency_ms: {close}"
        by_join[close["join_id"]].append(close)
    left = Counter(lines)
    for dead in outputs["dead_letter"]:
        raw = base64.b64decode(dead["raw_base64"]) if "raw_base64" in dead \
            else dead["raw"].encode("utf-8", "surrogatepass")
        if dead["error"] == "too_large" and not left[raw]:  # a long line's first bytes, size
            size = int(dead["detail"].split(" ", 1)[0])
            raw = next((line for line, n in left.items()
                        if n and len(line) == size and line.startswith(raw)), raw)
        assert left[raw] > 0, f"dead letter matches no input line left: {raw[:200]!r}"
        left[raw] -= 1
    by_object: Counter[str] = Counter()
    texts: dict[str, list[bytes]] = defaultdict(list)
    for line, count in left.items():
        parsed = _message(line)
        if parsed is None:
            assert count == 0, f"input line neither a dead letter nor a message: {line[:200]!r}"
            continue
        key = _key(json.loads(line))
        by_object[key] += count
        texts[key].append(line)
    for late in outputs["late"]:
        key = _key(late["message"])
        assert by_object[key] > 0, f"late line matches no input message left: {late}"
        by_object[key] -= 1
        join_id, time = _message(texts[key][0])  # type: ignore[misc]
        assert late["join_id"] == join_id, f"late line under another join: {late}"
        problems = [_late_problem(late, time, close, eager) for close in by_join[join_id]]
        assert not problems or None in problems, problems[0]
    counted: dict[str, list[int]] = defaultdict(list)
    for key, count in by_object.items():
        if count:
            join_id, time = _message(texts[key][0])  # type: ignore[misc]
            counted[join_id] += [time] * count
    for join_id, times in counted.items():
        joined = by_join.get(join_id)
        assert joined, f"{len(times)} message(s) of join {join_id!r} are in no output"
        for time in times:
            assert any(max(time, epoch_ms(c["opened_at"])) <= epoch_ms(c["closed_at"])
                       for c in joined), \
                f"join {join_id!r}: a counted message at {rfc3339(time)} is after closed_at " \
                f"{joined[0]['closed_at']}"
    for join_id, joined in by_join.items():
        total = sum(c["counts"]["messages"] for c in joined)
        assert total == len(counted.get(join_id, ())), \
            f"join {join_id!r}: closes count {total} messages, " \
            f"{len(counted.get(join_id, ()))} are neither late nor dead letters"
