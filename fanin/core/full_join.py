"""A full join: one that reached its per-join limit (docs/spec.md §4), for the bounded and the
streaming plan alike (no Beam import).

A full join is decided once over the records it holds; ``full_decision`` keeps what the
records beyond the limit need of that decision, as a plain list (the streaming join stores it
in its state, so its layout is fixed: ``[closed_at, deadline, reason, tombstone_end]`` after a
close, ``[None, decided_at, None]`` when undefined; an earlier Fanin wrote a close's without
``tombstone_end``).

Guarantees: ``boundary`` is where the full join ends (a record after it starts the next
join); ``beyond_limit_outputs`` gives a record beyond the limit, not after the boundary,
exactly one output: late (``after_deadline`` or ``after_close``, as ``late_reason``) if the
join closed before the record's event time, else a ``join_too_large`` dead letter.
"""

from __future__ import annotations

from typing import Any

from fanin.contracts import records as R
from fanin.contracts.timefmt import MAX_MS
from fanin.core.closing import Closed, Undefined, late_reason
from fanin.core.outcomes import LATE, Output, late_object, rejected_outputs

__all__ = ["TOO_LARGE_DETAIL", "beyond_limit_outputs", "boundary", "full_decision"]

TOO_LARGE_DETAIL = ("the join holds max_messages_per_join messages or max_bytes_per_join bytes of "
                    "messages already")


def full_decision(outcome: Closed | Undefined) -> list[Any]:
    """What the records beyond a full join's limit need of its decision (layout above)."""
    if isinstance(outcome, Closed):
        return [outcome.closed_at, outcome.deadline, outcome.reason, outcome.tombstone_end]
    return [None, outcome.decided_at, None]


def boundary(full: list[Any]) -> int:
    """Where a full join ends: its tombstone's end after a close (for a close an earlier
    Fanin kept without it, the last instant a record can have: none is after it), its
    decision time when undefined. A record after it belongs to the next join."""
    if full[0] is None:
        return int(full[1])
    return int(full[3]) if len(full) > 3 else MAX_MS


def beyond_limit_outputs(record: R.Record, full: list[Any]) -> list[Output]:
    """The one output of a record that does not fit a full join and is not after its
    ``boundary``: late if the join closed before the record's event time, else
    ``join_too_large``."""
    closed_at, deadline, reason = full[:3]
    time = record[R.TIME]
    if closed_at is not None and time > closed_at:
        return [(LATE, late_object(record, late_reason(time, deadline), reason))]
    return list(rejected_outputs([record], "join_too_large", TOO_LARGE_DETAIL))
