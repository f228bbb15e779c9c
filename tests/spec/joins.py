"""Generated joins for the differential test: the contracts they use and a generator that
runs on hypothesis draws (shrinkable) or on a seeded ``random.Random`` (cheap, for big batches).

A join has zero, one or two opens (duplicate or conflicting), receipts before and after its
``opened_at`` and deadline, definitions carried only by receipts (``contract``,
``opened_at``), skips with path prefixes, retries, redeliveries, changed duplicates, key
conflicts, schema violations, several contracts, ties on the millisecond, stragglers
after a tombstone expired (contract ``c6`` keeps its tombstone 5 s), and messages docs/spec.md
§1 refuses (bad fields, repeated names, NaN, 1e400, lone surrogates, nesting 65 deep, not an
object, cut short). Every choice shrinks towards the plain case (no feature).
"""

from __future__ import annotations

import json
import random
from typing import Any, Protocol

from hypothesis import strategies as st

from spec.reference import read_contracts, rfc3339

__all__ = ["CONTRACTS_YAML", "J28", "Draw", "HypothesisDraw", "RandomDraw",
           "batch_lines", "join_messages"]

CONTRACTS_YAML = """\
contracts:
  - name: c1
    required: [a, b]
    optional: [o]
    deadline_s: 10
  - name: c2
    required: [a, r/x, r/y]
    optional: [o, r/z, rx]
    deadline_s: 20
    allow_partial: true
    schemas:
      score: {type: number, minimum: 0, maximum: 1}
  - name: c3
    required: [a]
    deadline_s: 5
    fail_fast: true
  - name: c4
    optional: [o]
    deadline_s: 15
  - name: c5
    required: [a, b]
    optional: [r/x]
    deadline_s: 40
    allow_partial: true
    fail_fast: true
    schemas:
      k: {type: integer}
  - name: c6
    required: [a, b]
    deadline_s: 10
    retention_s: 5
"""
NAMES = sorted(read_contracts(CONTRACTS_YAML))
BRANCHES = ["a", "b", "o", "r/x", "r/y", "r/z", "rx", "u"]
SKIP_PATHS = ["r", "a", "r/x", "o", "u", "r/z"]
VALUES: list[Any] = [1, 2, 1.0, "x", 0.5, 7, None, [1], {"v": 1}, True, "é\u2028"]
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


class Draw(Protocol):
    """The choices a generator makes; each shrinks towards its first / smallest answer."""

    def integer(self, lo: int, hi: int) -> int: ...
    def pick(self, options: list[Any]) -> Any: ...
    def chance(self, percent: int) -> bool: ...


class HypothesisDraw:
    def __init__(self, data: st.DataObject) -> None:
        self._draw = data.draw

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(st.integers(lo, hi))

    def pick(self, options: list[Any]) -> Any:
        return self._draw(st.sampled_from(options))

    def chance(self, percent: int) -> bool:
        return self._draw(st.integers(0, 99)) >= 100 - percent  # shrinks to False


class RandomDraw:
    def __init__(self, rnd: random.Random) -> None:
        self._rnd = rnd

    def integer(self, lo: int, hi: int) -> int:
        return self._rnd.randint(lo, hi)

    def pick(self, options: list[Any]) -> Any:
        return self._rnd.choice(options)

    def chance(self, percent: int) -> bool:
        return self._rnd.randrange(100) < percent


def _time(d: Draw, base: int) -> str:
    """A time in the join's first minute: whole seconds, sometimes 1 ms off (ties and
    deadline edges)."""
    ms = d.integer(0, 50) * 1000
    if d.chance(15):
        ms += d.pick([1, -1, 500])
    return rfc3339(base + max(ms, 0))


def _branches(d: Draw, pool: list[str]) -> list[str]:
    return [b for b in pool if d.chance(40)]


def _ids(d: Draw, msg: dict[str, Any], n: int) -> None:
    if d.chance(20):
        msg["run_id"] = d.pick(["r1", "r2", "r0"])
    if d.chance(20):
        msg["message_id"] = f"m{n}"


def _open(d: Draw, join_id: str, base: int, n: int) -> dict[str, Any]:
    msg: dict[str, Any] = {"kind": "open", "join_id": join_id, "opened_at": _time(d, base)}
    if d.chance(60):
        msg["contract"] = d.pick(NAMES)
    if d.chance(35):
        msg["required"] = _branches(d, BRANCHES[:5])
    if d.chance(25):
        msg["optional"] = [b for b in _branches(d, BRANCHES[2:7])
                           if b not in msg.get("required", ())]
    if d.chance(30):
        msg["deadline_s"] = d.pick([10, 5, 12.5, 30, 2.006])
    for flag in ("allow_partial", "fail_fast"):
        if d.chance(20):
            msg[flag] = d.pick([True, False])
    _ids(d, msg, n)
    return msg


def _receipt(d: Draw, join_id: str, base: int, n: int) -> dict[str, Any]:
    status = d.pick(["ok", "ok", "error", "timeout", "skipped"])
    branch = d.pick(SKIP_PATHS if status == "skipped" else BRANCHES)
    msg: dict[str, Any] = {"join_id": join_id, "branch": branch, "status": status,
                           "event_time": _time(d, base)}
    if d.chance(25):
        msg["key"] = d.pick(["k", "score", "a"])
    if status == "ok" or d.chance(10):
        msg["value"] = d.pick(VALUES)
    if status == "error" and d.chance(50):
        msg["error"] = "boom"
    if d.chance(20):
        msg["attempt"] = d.pick([1, 2, 3])
    if d.chance(20):
        msg["opened_at"] = _time(d, base)
    if d.chance(25):
        msg["contract"] = d.pick(NAMES)
    _ids(d, msg, n)
    return msg


def join_messages(d: Draw, join_id: str, base: int = BASE_MS) -> list[dict[str, Any]]:
    """The messages of one join, in a drawn order (the file order of a bounded run)."""
    msgs: list[dict[str, Any]] = []
    for _ in range(d.pick([0, 1, 1, 2])):
        if msgs and d.chance(50):  # a duplicate open (ids may differ)
            copy = {k: v for k, v in msgs[0].items() if k not in ("run_id", "message_id")}
            _ids(d, copy, len(msgs))
            msgs.append(copy)
        else:
            msgs.append(_open(d, join_id, base, len(msgs)))
    for _ in range(d.integer(0, 7)):
        msgs.append(_receipt(d, join_id, base, len(msgs)))
    receipts = [m for m in msgs if m.get("kind") != "open"]
    for _ in range(d.integer(0, 3) if receipts else 0):
        source = d.pick(receipts)
        how = d.pick(["redelivery", "retry", "changed", "copy_later"])
        copy = dict(source)
        if how == "retry":
            copy["attempt"] = source.get("attempt", 1) + 1
            copy["status"] = d.pick(["ok", "error", "timeout"])
            copy["value"] = d.pick(VALUES)
        elif how == "changed":
            copy["value"] = d.pick(VALUES)
        if how != "redelivery":
            copy["event_time"] = _time(d, base)
        msgs.append(copy)
    order = list(range(len(msgs)))
    if d.chance(50):
        order.reverse()
    return [msgs[i] for i in order]


# Changes that make a message one docs/spec.md §1 refuses (or, the last ones, one it reads
# as before): to its fields, or to its text
_BAD_FIELDS: list[tuple[str, Any]] = [
    ("attempt", 0), ("attempt", 2.0), ("attempt", True), ("attempt", 2**63), ("status", "done"),
    ("event_time", "2026-01-01T00:00:00"), ("event_time", "2026-02-30T00:00:00Z"),
    ("opened_at", "2026-01-01T24:00:00Z"), ("join_id", ""), ("join_id", 7), ("join_id", None),
    ("branch", ""), ("contract", "nope"), ("contract", ""), ("kind", "close"), ("key", 5),
    ("run_id", 7), ("deadline_s", 0), ("deadline_s", "5"), ("allow_partial", "true"),
    ("required", ["a", ""]), ("optional", "o"), ("event_time", None), ("error", False),
    ("opened_at", "2026-01-01T00:00:00+24:00"), ("extra", "kept"), ("opened_at", None),
]
_BAD_TEXTS = [
    lambda line: line[:-1] + ',"join_id":"other"}',  # a repeated name
    lambda line: line[:-1] + ',"extra":NaN}',
    lambda line: line[:-1] + ',"extra":1e400}',
    lambda line: line[:-1] + ',"extra":"\\ud800"}',  # a lone surrogate escape
    lambda line: line[:-1] + ',"extra":' + "[" * 64 + "]" * 64 + "}",  # 65 deep
    lambda line: line[:-1] + ',"extra":' + "[" * 63 + "]" * 63 + "}",  # 64 deep: read
    lambda line: "[" + line + "]",
    lambda line: line[:-1],
    lambda line: "   ",
]


def _broken(d: Draw, msg: dict[str, Any]) -> str:
    """``msg`` changed by one of the changes above, as a line."""
    if d.chance(50):
        name, value = d.pick(_BAD_FIELDS)
        msg = {**msg, name: value}
        if name == "optional" and msg.get("kind") == "open" and d.chance(50):
            msg.update(required=["a", "b"], optional=["b"])  # both required and optional
        return json.dumps(msg, ensure_ascii=False)
    return str(d.pick(_BAD_TEXTS)(json.dumps(msg, ensure_ascii=False)))


def batch_lines(d: Draw, joins: int, spacing_ms: int = 100, broken: int = 4) -> list[str]:
    """The lines of ``joins`` joins, their times overlapping, interleaved; each message is
    changed into one §1 refuses (mostly) with ``broken`` percent chance."""
    per_join = [[_broken(d, m) if d.chance(broken) else json.dumps(m, ensure_ascii=False)
                 for m in join_messages(d, f"j{i}", BASE_MS + spacing_ms * i)]
                for i in range(joins)]
    lines: list[str] = []
    while live := [msgs for msgs in per_join if msgs]:
        lines.append(live[d.integer(0, len(live) - 1)].pop(0))
    return lines


T = "2026-01-01T00:00:"
J28 = [json.dumps({"join_id": "j28", **fields}) for fields in (  # found with
    # FANIN_SPEC_EXAMPLES=1500: three rounds of one join inside a 30 s watermark lag
    {"branch": "r", "status": "skipped", "event_time": T + "06.799Z"},
    {"branch": "o", "status": "timeout", "event_time": T + "21.800Z", "contract": "c6"},
    {"branch": "o", "status": "timeout", "event_time": T + "25.800Z", "contract": "c6",
     "attempt": 2, "value": 0.5},
    {"branch": "u", "status": "ok", "event_time": T + "28.800Z", "value": "x"},
    {"branch": "u", "status": "skipped", "event_time": T + "28.800Z", "contract": "c1"},
    {"branch": "r/z", "status": "skipped", "event_time": T + "34.800Z", "value": None},
    {"kind": "open", "opened_at": T + "37.800Z", "contract": "c1"},
    {"branch": "a", "status": "error", "event_time": T + "46.800Z", "error": "boom",
     "attempt": 1},
    {"branch": "a", "status": "timeout", "event_time": T + "49.800Z", "value": [1]},
    {"branch": "a", "status": "timeout", "event_time": T + "49.800Z", "value": [1]},
)]
