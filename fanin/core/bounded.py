"""The bounded decision of one join: all of its records -> its outputs (no Beam import).

``bounded_outputs`` is what the bounded plan's close step runs for each join, and the
reference the streaming ``JoinDoFn`` agrees with on input replayed in event-time order.

Guarantees: every record appears in exactly one output (in the close's ``counts.messages``,
one late line, or one dead letter); the per-join limits and tombstones follow docs/spec.md
§4: a join holds its first records in arrival order (event time, opens first, then the text;
records equal in all three by the order the input gives them) within ``max_messages`` and
``max_bytes``; a record beyond them is late if the join closes before its event time, starts
the next join if an undefined join is decided before it, else it is ``join_too_large``; a
record after a closed join's tombstone starts the next join.

Memory: a join decides at most ``max_messages`` records at a time. The outputs are yielded as
they are made, and a record beyond the limit is classified and yielded as it streams by, never
held: a hot join of a million messages holds its first ``max_messages`` records (and Beam's
grouped input), not a million outputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice
from typing import Any

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog
from fanin.core.closing import Closed, Undefined, decide
from fanin.core.full_join import beyond_limit_outputs, boundary, full_decision
from fanin.core.outcomes import Output, closed_outputs, rejected_outputs

__all__ = ["UNDEFINED_DETAIL", "OnError", "arrival_order", "bounded_outputs", "held_count",
           "message_bytes"]

# what the caller makes of records the core failed on (the exception, those records)
OnError = Callable[[Exception, Iterable[R.Record]], Iterable[Output]]

UNDEFINED_DETAIL = ("no required branches from the open, its contract or the defaults by the "
              "deadline")
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


def bounded_outputs(records: Iterable[R.Record], catalog: Catalog, max_messages: int,
                    max_bytes: int, on_error: OnError | None = None) -> Iterator[Output]:
    """The outputs of one join's records, every record known (see the module docstring).

    ``records`` is iterated once when the join is within ``max_messages``. A decision over
    more records than that reads them twice (for the first ``max_messages`` in arrival order,
    then for the rest as they stream by) and the next decision reads them again, so
    ``records`` must give the same records in the same order each time (a list, or Beam's
    grouped values).

    The join is decided in rounds: a round decides the join's records after the previous
    round's tombstone or undefined decision (all of them, in the first round). With
    ``on_error``, an exception the core raises while deciding a round does not escape: the
    outputs of ``on_error(exception, records)`` for that round's records (every record not
    in an output yet) end the join; one raised while classifying a record beyond the limit
    gives ``on_error(exception, [record])`` for that record. Without it, the exception
    propagates. Either way every record is in exactly one output.
    """
    after: int | None = None  # records at or before it were decided in an earlier round
    known: list[R.Record] | None = None  # this round's records, when held in memory
    while True:
        first: list[tuple[Any, ...]] = []
        if known is None:  # read this round's records: held whole up to max_messages
            pending = _after(records, after)
            known = list(islice(pending, max_messages + 1))
            if len(known) > max_messages:
                # the first max_messages in arrival order, ties by input position (a stable
                # sort's order), without holding the others
                first = heapq.nsmallest(max_messages, (
                    (arrival_order(r), i, r) for i, r in enumerate(chain(known, pending))))
                known = None
        if known is not None and not known:
            return
        try:
            if known is not None:
                held, overflow = _held(known, max_messages, max_bytes)
            else:
                cut = held_count([r for _, _, r in first], max_messages, max_bytes)
                held, overflow, last = [r for _, _, r in first[:cut]], [], first[cut - 1][:2]
            outcome = decide(held, catalog, None)
            if not isinstance(outcome, (Closed, Undefined)):
                raise ValueError(f"a bounded join must be decided, not {outcome!r}")
            decided = list(_decided_outputs(outcome))
        except Exception as exc:
            if on_error is None:
                raise
            yield from on_error(exc, known if known is not None else _after(records, after))
            return
        yield from decided
        full = full_decision(outcome)
        end = boundary(full)
        if known is not None:  # the next round's records, as the input gave them
            rest = outcome.reopened if isinstance(outcome, Closed) else outcome.rest
            beyond: Iterable[R.Record] = overflow
            known = rest + [r for r in overflow if r[R.TIME] > end]
        else:
            beyond = (r for i, r in enumerate(_after(records, after))
                      if (arrival_order(r), i) > last)
            known = None
        for record in beyond:
            if record[R.TIME] <= end:
                yield from _beyond_limit(record, full, on_error)
        after = end


def _after(records: Iterable[R.Record], after: int | None) -> Iterator[R.Record]:
    """The records with event time after ``after`` (all of them if None), in input order."""
    return iter(records) if after is None else (r for r in records if r[R.TIME] > after)


def _held(records: list[R.Record], max_messages: int, max_bytes: int
          ) -> tuple[list[R.Record], list[R.Record]]:
    """``records`` split into what the join holds and what is beyond its limits (arrival
    order), or held whole when they fit."""
    # UTF-8 takes at most 4 bytes a character: count bytes only when they may not fit
    if len(records) <= max_messages and 4 * sum(len(r[R.RAW]) for r in records) <= max_bytes:
        return records, []
    ordered = sorted(records, key=arrival_order)
    cut = held_count(ordered, max_messages, max_bytes)
    return ordered[:cut], ordered[cut:]


def _decided_outputs(outcome: Closed | Undefined) -> Iterator[Output]:
    """The outputs of the records a round held."""
    if isinstance(outcome, Closed):
        return closed_outputs(outcome)
    return rejected_outputs(outcome.rejected, "undefined_join", UNDEFINED_DETAIL)


def _beyond_limit(record: R.Record, full: list[Any], on_error: OnError | None
                  ) -> Iterable[Output]:
    """``beyond_limit_outputs``, its failure handed to ``on_error``."""
    try:
        return beyond_limit_outputs(record, full)
    except Exception as exc:
        if on_error is None:
            raise
        return on_error(exc, [record])
