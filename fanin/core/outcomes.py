"""Turning closing decisions into output objects and counting them (no Beam import).

Guarantees:
- ``closed_outputs`` yields the close object, then one late object per late record
  (``{join_id, reason, close_reason, message}``, ``message`` being the original object).
- ``rejected_outputs`` yields one dead-letter object per record (``undefined_join``).
- ``log_close`` writes one structured event per close on the ``fanin.close`` logger (run id,
  join id, required branches, the number of declared branches whose current receipt is
  ``ok``, close reason, conflict count) and never any receipt value.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from fanin.contracts import records as R
from fanin.contracts.jsonvalue import output_json
from fanin.contracts.parsing import dead_letter
from fanin.core.closing import Closed

__all__ = ["CLOSES", "DEAD_LETTER", "LATE", "Output", "closed_outputs", "encode_line",
           "late_object", "log_close", "rejected_outputs"]

CLOSES, LATE, DEAD_LETTER = "closes", "late", "dead_letter"
Output = tuple[str, dict[str, Any]]  # (the output's kind, its object)
_CLOSE_LOG = logging.getLogger("fanin.close")


def late_object(record: R.Record, reason: str, close_reason: str) -> dict[str, Any]:
    """The late line of docs/spec.md §5 for one record of a join that closed with
    ``close_reason``."""
    return {"join_id": record[R.JOIN_ID], "reason": reason, "close_reason": close_reason,
            "message": json.loads(record[R.RAW])}


def closed_outputs(outcome: Closed) -> Iterator[tuple[str, dict[str, Any]]]:
    yield CLOSES, outcome.close
    for record, reason in outcome.late:
        yield LATE, late_object(record, reason, outcome.reason)


def rejected_outputs(records: Iterable[R.Record], error: str, detail: str
                     ) -> Iterator[tuple[str, dict[str, Any]]]:
    for record in records:
        yield DEAD_LETTER, dead_letter(error, detail, record[R.RAW], record[R.SOURCE])


def log_close(close: dict[str, Any]) -> None:
    if _CLOSE_LOG.isEnabledFor(logging.INFO):
        _CLOSE_LOG.info(json.dumps({
            "event": "join_closed", "run_id": close["run_id"], "join_id": close["join_id"],
            "required": close["required"],
            "accepted": sum(view["status"] == "ok" for view in close["branches"].values()),
            "reason": close["reason"], "conflicts": len(close["conflicts"]),
        }))


def encode_line(obj: dict[str, Any]) -> str:
    """The one encoding of an output object, for files and Pub/Sub topics alike: compact
    UTF-8 JSON, fields in the order built, every number as orjson writes it (a double in its
    shortest form, ``1e-7``). An integer orjson refuses (beyond 64 bits) is written with its
    digits, the rest of the object as orjson writes it (the standard encoder would spell the
    object's doubles otherwise: ``1e-07``)."""
    return output_json(obj)
