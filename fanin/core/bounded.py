"""The bounded decision of one join: all of its records -> its outputs (no Beam import).

``bounded_outputs`` is what the bounded plan's close step runs for each join, and the
reference the streaming ``JoinDoFn`` agrees with on input replayed in event-time order.

Guarantees: every record appears in exactly one output (in the close's ``counts.messages``,
one late line, or one dead letter); the per-join limits and tombstones follow docs/spec.md
§4: a join holds its first records in arrival order (event time, opens first, then the text)
within ``max_messages`` and ``max_bytes``; a record beyond them is late if the join closes
before its event time, starts the next join if an undefined join is decided before it, else
it is ``join_too_large``; a record after a closed join's tombstone starts the next join.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog
from fanin.core.closing import Closed, Undefined, decide, late_reason
from fanin.core.outcomes import LATE, closed_outputs, late_object, rejected_outputs

__all__ = ["TOO_LARGE_DETAIL", "UNDEFINED_DETAIL", "arrival_order", "bounded_outputs",
           "held_count", "message_bytes"]

Output = tuple[str, dict[str, Any]]

UNDEFINED_DETAIL = ("no required branches from the open, its contract or the defaults by the "
              "deadline")
TOO_LARGE_DETAIL = ("the join holds max_messages_per_join messages or max_bytes_per_join bytes of "
              "messages already")
def message_bytes(record: R.Record) -> int:
    """UTF-8 bytes of the record's message as received (what max_bytes_per_join counts)."""
    raw = record[R.RAW]
    return len(raw) if raw.isascii() else len(raw.encode("utf-8"))


def held_count(records: list[R.Record], max_messages: int, max_bytes: int) -> int:
    """How many of ``records`` (in arrival order) the join holds: the longest prefix within
    ``max_messages`` and ``max_bytes`` (the first record always fits)."""
    total = 0
    for i, record in enumerate(records[:max_messages]):
        total += message_bytes(record)
        if total > max_bytes and i > 0:
            return i
    return min(len(records), max_messages)


def arrival_order(record: R.Record) -> tuple[Any, ...]:
    """Bounded input has no arrival order: event time, opens first, then the text."""
    return (record[R.TIME], record[R.KIND] != R.OPEN, record[R.RAW])


def bounded_outputs(records: list[R.Record], catalog: Catalog, max_messages: int,
                    max_bytes: int) -> list[Output]:
    """The outputs of one join's records, every record known (see the module docstring)."""
    outputs: list[Output] = []
    pending = records
    while pending:
        overflow: list[R.Record] = []
        # UTF-8 takes at most 4 bytes a character: count bytes only when they may not fit
        if len(pending) > max_messages or 4 * sum(len(r[R.RAW]) for r in pending) > max_bytes:
            pending = sorted(pending, key=arrival_order)
            held = held_count(pending, max_messages, max_bytes)
            pending, overflow = pending[:held], pending[held:]
        outcome = decide(pending, catalog, None)
        if isinstance(outcome, Closed):
            expiry = max(outcome.deadline + outcome.retention_ms, outcome.decided_at)
            outputs += closed_outputs(outcome)
            outputs += _overflow_outputs([r for r in overflow if r[R.TIME] <= expiry], outcome)
            # after the tombstone: the next join
            pending = outcome.reopened + [r for r in overflow if r[R.TIME] > expiry]
            continue
        if not isinstance(outcome, Undefined):
            raise ValueError(f"a bounded join must be decided, not {outcome!r}")
        outputs += rejected_outputs(outcome.rejected, "undefined_join", UNDEFINED_DETAIL)
        outputs += rejected_outputs([r for r in overflow if r[R.TIME] <= outcome.decided_at],
                                    "join_too_large", TOO_LARGE_DETAIL)
        pending = outcome.rest + [r for r in overflow if r[R.TIME] > outcome.decided_at]
    return outputs


def _overflow_outputs(overflow: Iterable[R.Record], closed: Closed
                      ) -> Iterator[tuple[str, dict[str, Any]]]:
    """Records beyond the per-join limit of a join that closes as ``closed``: late if after
    ``closed_at``, else ``join_too_large``."""
    for record in overflow:
        if record[R.TIME] > closed.closed_at:
            yield LATE, late_object(record, late_reason(record[R.TIME], closed.deadline),
                                    closed.reason)
        else:
            yield from rejected_outputs([record], "join_too_large", TOO_LARGE_DETAIL)
