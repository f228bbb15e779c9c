"""Pydantic models of the input messages of docs/spec.md §1 (open and receipt).

Guarantees:
- Validation is strict: a field of the wrong JSON type is an error (``"false"`` is not a boolean,
  ``1`` is not a string, ``true`` is not an integer); every bad field is reported once.
- Fields not in the message table (docs/spec.md §1) are ignored here (they stay in the original
  text, which the pipeline keeps); fields the table marks "ignored" for a kind are not validated for
  that kind.
- An explicit JSON ``null`` for an optional field means the same as leaving the field out.
- Times are returned as integer epoch milliseconds (see ``timefmt``).
- ``attempt`` is an integer from 1 to ``MAX_ATTEMPT`` (2**63 - 1).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from fanin.contracts.timefmt import parse_rfc3339

__all__ = ["MAX_ATTEMPT", "OpenMessage", "ReceiptMessage", "Seconds", "Status"]

# The largest ``attempt``: a signed 64-bit integer, the type of the attempt columns of the
# Parquet files, the BigQuery tables (INT64) and DuckDB (BIGINT). A larger one is refused at
# parse time (``invalid_message``), so every output can hold every accepted attempt.
MAX_ATTEMPT = 2**63 - 1

Status = Literal["ok", "error", "timeout", "skipped"]


def _time(value: Any) -> int:
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 string")
    return parse_rfc3339(value)


JoinId = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Name = Annotated[str, StringConstraints(min_length=1)]
Millis = Annotated[int, BeforeValidator(_time)]


class _Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    join_id: JoinId
    contract: Name | None = None
    run_id: str | None = None
    message_id: str | None = None


def _beyond_double(value: Any) -> Any:
    """An integer number of seconds beyond double range is the largest double of its sign:
    a time it gives is capped at the end of year 9999 either way (docs/spec.md §2), as for
    ``1e300``, and a negative one is refused as any negative duration is."""
    if type(value) is int and abs(value) > sys.float_info.max:
        return sys.float_info.max if value > 0 else -sys.float_info.max
    return value


# A number of seconds (``deadline_s``, ``retention_s``), also an integer beyond double range
Seconds = Annotated[float, BeforeValidator(_beyond_double)]


class OpenMessage(_Message):
    """``kind: "open"``: one per fan-out; defines the join (docs/spec.md §1-2)."""

    kind: Literal["open"] = "open"
    opened_at: Millis
    required: list[Name] | None = None
    optional: list[Name] | None = None
    deadline_s: Annotated[Seconds, Field(gt=0, allow_inf_nan=False)] | None = None
    allow_partial: bool | None = None
    fail_fast: bool | None = None


class ReceiptMessage(_Message):
    """``kind: "receipt"`` (the default): one per branch result (docs/spec.md §1, §3)."""

    kind: Literal["receipt"] | None = "receipt"  # null means absent (docs/spec.md §1)
    branch: Name
    status: Status
    event_time: Millis
    opened_at: Millis | None = None
    key: str | None = None
    value: Any = None
    error: str | None = None
    attempt: Annotated[int, Field(ge=1, le=MAX_ATTEMPT)] | None = None
