"""Synthetic workloads for the benchmarks: pre-parsed records of many joins of one width."""

from __future__ import annotations

import json
import random

from fanin.contracts.catalog import Catalog
from fanin.contracts.parsing import parse_message
from fanin.contracts.records import Record
from fanin.contracts.timefmt import format_ms

__all__ = ["join_lines", "join_records"]

_T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def join_lines(receipts: int, width: int, seed: int = 1) -> list[str]:
    """Opens plus ``receipts`` receipts in joins of ``width`` branches, in arrival order.

    One receipt in ten is a redelivery, one in twenty a retry (attempt 2); joins interleave.
    """
    rnd = random.Random(seed)
    lines: list[str] = []
    joins = max(1, receipts // width)
    for j in range(joins):
        join_id = f"join-{j:07d}"
        t = _T0 + j * 10
        branches = [f"b{i:02d}" for i in range(width)]
        lines.append(json.dumps({"kind": "open", "join_id": join_id, "opened_at": format_ms(t),
                                 "required": branches, "deadline_s": 30}))
        for i, branch in enumerate(branches):
            msg = {"join_id": join_id, "branch": branch, "status": "ok",
                   "event_time": format_ms(t + 1 + i), "key": branch,
                   "value": {"score": rnd.random(), "n": i}}
            lines.append(json.dumps(msg))
            roll = rnd.random()
            if roll < 0.1:
                lines.append(json.dumps(msg))
            elif roll < 0.15:
                lines.append(json.dumps({**msg, "attempt": 2}))
    return lines


def join_records(lines: list[str], catalog: Catalog) -> list[Record]:
    out = []
    for number, line in enumerate(lines):
        rec, dead = parse_message(line, {"kind": "bench", "line": number}, catalog.contracts)
        assert dead is None, dead
        out.append(rec)
    return out
