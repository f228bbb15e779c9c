"""The join context: what a fan-out hands to each of its branches (docs/spec.md §1 "join context").

Guarantees:
- A ``JoinContext`` is immutable and carries exactly the fields every message of the join
  repeats: ``join_id`` (non-empty, at most 256 characters), ``opened_at`` (RFC 3339 UTC with
  milliseconds: any RFC 3339 time given is kept as that instant in this form, truncated to
  the millisecond as the pipeline reads it), ``contract`` and ``run_id`` (strings or
  ``None``).
- ``to_dict``/``from_dict`` and ``to_json``/``from_json`` round-trip exactly, so a context can
  cross process boundaries (task queues, HTTP headers, environment variables).
- ``from_dict``/``from_json`` validate: a missing or mistyped field raises ``ValueError`` naming
  the field; unknown fields are refused, so a typo does not silently drop data. ``from_json``
  reads JSON as the pipeline does (docs/spec.md §1): a field name given twice is refused, not
  the last one taken.
- ``JoinContext.new`` generates a random, unique ``join_id`` (UUID4 hex) unless one is given.
- ``attempt`` (``None`` or an integer >= 1) lets a retry travel with the context: the process
  that hands a failed branch to another process (a task queue, a retry worker) passes
  ``ctx.with_attempt(n + 1)``; an ``Emitter`` receiving that context reports the branches it
  runs with attempt ``n + 1`` or more (see ``fanin.sdk.emitter``). ``to_dict``/``to_json``
  carry ``attempt`` only when it is set, so contexts without one are unchanged on the wire.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fanin.contracts.jsonvalue import loads_strict
from fanin.contracts.timefmt import MAX_MS, MIN_MS, format_ms, parse_rfc3339

__all__ = ["MAX_JOIN_ID_LENGTH", "Clock", "ClockError", "JoinContext", "now_rfc3339"]

MAX_JOIN_ID_LENGTH = 256

Clock = Callable[[], float]
"""A wall clock returning seconds since the Unix epoch, like ``time.time``."""


class ClockError(ValueError):
    """The clock returned something that is not seconds since the Unix epoch within years
    0001-9999 (NaN, ``time.time_ns``'s nanoseconds, milliseconds far in the future...)."""


def now_rfc3339(clock: Clock = time.time) -> str:
    """The clock's current time as RFC 3339 UTC with milliseconds (truncated); ``ClockError``
    when the clock's answer is not seconds since the epoch within years 0001-9999, rather
    than a time clamped to the end of year 9999."""
    seconds = clock()
    try:
        ms = math.floor(seconds * 1000)  # truncated toward the past, also before 1970
    except (TypeError, ValueError, OverflowError):
        ms = None
    if isinstance(seconds, bool) or ms is None or not MIN_MS <= ms <= MAX_MS:
        raise ClockError(f"the clock returned {seconds!r}, which is not seconds since "
                         "1970-01-01 within years 0001-9999 (like time.time; not "
                         "time.time_ns or milliseconds)")
    return format_ms(ms)


_FIELDS = ("join_id", "opened_at", "contract", "run_id")
_OPTIONAL_FIELDS = ("attempt",)


@dataclass(frozen=True)
class JoinContext:
    """Identity of one join, created at fan-out and passed to every branch."""

    join_id: str
    opened_at: str
    contract: str | None = None
    run_id: str | None = None
    attempt: int | None = None
    """The least attempt its holder reports for a branch (``None``: start at 1)."""

    def __post_init__(self) -> None:
        if not isinstance(self.join_id, str) or not 1 <= len(self.join_id) <= MAX_JOIN_ID_LENGTH:
            raise ValueError(f"join_id must be a string of 1-{MAX_JOIN_ID_LENGTH} characters")
        if not isinstance(self.opened_at, str):
            raise ValueError("opened_at must be an RFC 3339 string")
        try:
            opened = format_ms(parse_rfc3339(self.opened_at))
        except ValueError as exc:
            raise ValueError(f"opened_at {self.opened_at!r}: {exc}") from None
        object.__setattr__(self, "opened_at", opened)  # frozen: set once, normalised
        for name in ("contract", "run_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a string or None")
        if self.contract == "":
            raise ValueError("contract must be a non-empty string or None")
        if self.attempt is not None and (isinstance(self.attempt, bool)
                                         or not isinstance(self.attempt, int)
                                         or self.attempt < 1):
            raise ValueError("attempt must be an integer >= 1 or None")

    @classmethod
    def new(cls, contract: str | None = None, run_id: str | None = None, *,
            join_id: str | None = None, clock: Clock = time.time) -> JoinContext:
        """Open a new join now (per ``clock``); ``join_id`` defaults to a fresh UUID4 hex."""
        return cls(join_id=join_id if join_id is not None else uuid.uuid4().hex,
                   opened_at=now_rfc3339(clock), contract=contract, run_id=run_id)

    def with_attempt(self, attempt: int | None) -> JoinContext:
        """This context for a retry: its holder reports attempt ``attempt`` or later."""
        return replace(self, attempt=attempt)

    def to_dict(self) -> dict[str, Any]:
        """The four identity fields (``None`` included) and ``attempt`` if set, JSON-ready."""
        data = {name: getattr(self, name) for name in _FIELDS}
        if self.attempt is not None:
            data["attempt"] = self.attempt
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JoinContext:
        """Inverse of ``to_dict``; ``contract``/``run_id``/``attempt`` may be absent (``None``)."""
        if not isinstance(data, Mapping):
            raise ValueError("a join context must be a JSON object")
        unknown = set(data) - set(_FIELDS) - set(_OPTIONAL_FIELDS)
        if unknown:
            raise ValueError(f"unknown join context field(s): {sorted(unknown)}")
        for name in ("join_id", "opened_at"):
            if name not in data:
                raise ValueError(f"join context lacks field {name!r}")
        fields: dict[str, Any] = {name: data.get(name) for name in _FIELDS + _OPTIONAL_FIELDS}
        return cls(**fields)

    def to_json(self) -> str:
        """Compact JSON text of ``to_dict``."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> JoinContext:
        """Inverse of ``to_json``; invalid JSON (also a field name given twice, and bytes
        that are not UTF-8 without a byte order mark, as the pipeline reads messages) raises
        ``ValueError``."""
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return cls.from_dict(loads_strict(text))
