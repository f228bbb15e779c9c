"""The compact record a validated message travels as, from parse to join (plain tuples).

A record is a tuple of JSON-able primitives so that Beam encodes it with its fast primitive
coder (no pickling of model objects in state or shuffles). The field positions are the
constants below; ``OPEN`` and ``RECEIPT`` records share the first eight.

Common:  KIND, JOIN_ID, TIME (event time in epoch ms; an open's is its opened_at), RAW (the
         original text), SOURCE (dict: where it came from), CONTRACT, RUN_ID, MESSAGE_ID
Open:    O_REQUIRED, O_OPTIONAL (sorted tuples or None), O_DEADLINE_MS, O_ALLOW_PARTIAL,
         O_FAIL_FAST (None = not given), O_CANON (the open as canonical JSON over the message table
         (docs/spec.md §1) but run_id and message_id: equal exactly for identical opens, and the
         tie-break order)
Receipt: R_BRANCH, R_STATUS, R_KEY (defaulted to the branch), R_VALUE, R_ERROR, R_ATTEMPT,
         R_OPENED_AT (or None), R_CONTENT (canonical JSON of [status, key, error] followed by
         R_VALUE_CANON: equal exactly when the four are JSON-equal), R_VALUE_CANON (canonical
         JSON of the value)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CONTRACT",
    "JOIN_ID",
    "KIND",
    "MESSAGE_ID",
    "OPEN",
    "O_ALLOW_PARTIAL",
    "O_CANON",
    "O_DEADLINE_MS",
    "O_FAIL_FAST",
    "O_OPTIONAL",
    "O_REQUIRED",
    "RAW",
    "RECEIPT",
    "RUN_ID",
    "R_ATTEMPT",
    "R_BRANCH",
    "R_CONTENT",
    "R_ERROR",
    "R_KEY",
    "R_OPENED_AT",
    "R_STATUS",
    "R_VALUE",
    "R_VALUE_CANON",
    "SOURCE",
    "TIME",
    "Record",
]

Record = tuple[Any, ...]

OPEN = 0
RECEIPT = 1

KIND, JOIN_ID, TIME, RAW, SOURCE, CONTRACT, RUN_ID, MESSAGE_ID = range(8)
O_REQUIRED, O_OPTIONAL, O_DEADLINE_MS, O_ALLOW_PARTIAL, O_FAIL_FAST, O_CANON = range(8, 14)
R_BRANCH, R_STATUS, R_KEY, R_VALUE, R_ERROR, R_ATTEMPT, R_OPENED_AT, R_CONTENT = range(8, 16)
R_VALUE_CANON = 16
