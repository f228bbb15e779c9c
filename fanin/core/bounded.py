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
from bisect import bisect_right
from collections.abc import Callable, Generator, Iterable, Iterator
from itertools import accumulate, chain, islice
from typing import Any

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog
from fanin.contracts.timefmt import MAX_MS
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
    then for the rest as they stream by); the rounds after it that those first records decide
    are decided from them, and the next one reads the records again. So ``records`` must give
    the same records in the same order each time (a list, or Beam's grouped values).

    The join is decided in rounds: a round decides the join's records after the previous
    round's tombstone or undefined decision (all of them, in the first round). Once the
    records left fit in ``max_messages`` they are held in memory and the rounds left take
    time linear in them (``_later_rounds``). With ``on_error``, an exception the core raises
    while deciding a round does not escape: the outputs of ``on_error(exception, records)``
    for that round's records (every record not in an output yet) end the join; one raised
    while classifying a record beyond the limit gives ``on_error(exception, [record])`` for
    that record. Without it, the exception propagates. Either way every record is in exactly
    one output.
    """
    after: int | None = None  # records at or before it were decided in an earlier round
    while True:
        pending = _after(records, after)
        known = list(islice(pending, max_messages + 1))
        if len(known) <= max_messages:
            if known:
                yield from _held_rounds(known, catalog, max_messages, max_bytes, on_error)
            return
        # the first max_messages in arrival order, ties by input position (a stable sort's
        # order), without holding the others
        first = heapq.nsmallest(max_messages, (
            (arrival_order(r), i, r) for i, r in enumerate(chain(known, pending))))
        del known
        ordered, edge = [r for _, _, r in first], first[-1][:2]
        try:
            cut = held_count(ordered, max_messages, max_bytes)
            last = first[cut - 1][:2]
            del first
            outcome = _decided(ordered[:cut], catalog)
            decided = list(_decided_outputs(outcome))
        except Exception as exc:
            if on_error is None:
                raise
            yield from on_error(exc, _after(records, after))
            return
        yield from decided
        full = full_decision(outcome)
        end = boundary(full)
        outside = MAX_MS + 1  # the least event time of a record not in ``ordered``
        for i, record in enumerate(_after(records, after)):
            key = (arrival_order(record), i)
            if key > last and record[R.TIME] <= end:
                yield from _beyond_limit(record, full, on_error)
            if key > edge:
                outside = min(outside, record[R.TIME])
        # the next rounds, as far as the records held decide them
        decided_to = yield from _rounds(ordered, end, outside, catalog, max_messages,
                                        max_bytes, on_error)
        after = end if decided_to is None else decided_to


def _held_rounds(records: list[R.Record], catalog: Catalog, max_messages: int,
                 max_bytes: int, on_error: OnError | None) -> Iterator[Output]:
    """The rounds of a join's records held in memory (at most ``max_messages + 1`` of them):
    the first decided over them all, the others by ``_later_rounds``."""
    try:
        held, overflow = _held(records, max_messages, max_bytes)
        outcome = _decided(held, catalog)
        decided = list(_decided_outputs(outcome))
    except Exception as exc:
        if on_error is None:
            raise
        yield from on_error(exc, records)
        return
    yield from decided
    full = full_decision(outcome)
    end = boundary(full)
    for record in overflow:
        if record[R.TIME] <= end:
            yield from _beyond_limit(record, full, on_error)
    rest = outcome.reopened if isinstance(outcome, Closed) else outcome.rest
    later = rest + [r for r in overflow if r[R.TIME] > end]
    if later:
        yield from _later_rounds(later, catalog, max_messages, max_bytes, on_error)


def _decided(held: list[R.Record], catalog: Catalog) -> Closed | Undefined:
    """``decide`` of bounded input: always decided."""
    outcome = decide(held, catalog, None)
    if not isinstance(outcome, (Closed, Undefined)):
        raise ValueError(f"a bounded join must be decided, not {outcome!r}")
    return outcome


# records the first try of a later round decides over (doubled while not enough)
_WINDOW = 32


def _later_rounds(records: list[R.Record], catalog: Catalog, max_messages: int,
                  max_bytes: int, on_error: OnError | None) -> Iterator[Output]:
    """The rounds after a join's first, its records held in memory: the same outputs as
    deciding each round over all the records left, in time linear in the records (times the
    log of a round's size), however many rounds one join id makes (each a fresh join after a
    tombstone or an undefined decision; deciding each over every record left was quadratic)."""
    yield from _rounds(sorted(records, key=arrival_order), None, None, catalog, max_messages,
                       max_bytes, on_error)


def _rounds(ordered: list[R.Record], since: int | None, outside: int | None,
            catalog: Catalog, max_messages: int, max_bytes: int, on_error: OnError | None
            ) -> Generator[Output, None, int | None]:
    """The rounds of the records of ``ordered`` (in arrival order) after ``since`` (the
    boundary of the round decided before them; None: all of them); returns the boundary of
    the last round decided (None: none).

    ``outside`` is None when ``ordered`` holds every record left; else it is the least event
    time of a record not in it, all of them after ``ordered`` in arrival order (a hot join:
    they are not held). A round holds the longest prefix of the records left within
    ``max_messages`` and ``max_bytes``, and is decided over the first records of that prefix
    only, as many as make the decision the same as over all of it: a decision over some of
    them is the decision over all when every record it left out has an event time after the
    decision's ``boundary``: ``decide``'s walk folds a record at its event time, and one not
    folded by the decision (a receipt's earlier ``opened_at`` included) changes nothing of
    it. Records after the boundary form the next round. With ``outside``, the rounds stop (and
    the caller reads the records again) at the first round a record not held could change or
    fall in, or that raises."""
    n = len(ordered)
    times = [record[R.TIME] for record in ordered]
    sizes = list(accumulate((message_bytes(record) for record in ordered), initial=0))
    # the event time of the record after each index (after the last: what is not held)
    following = [*times[1:], MAX_MS + 1 if outside is None else outside]
    lo = 0 if since is None else bisect_right(times, since)
    last: int | None = None
    while lo < n:
        # the longest prefix within the limits (the first record always fits)
        held = min(max_messages, n - lo,
                   max(1, bisect_right(sizes, sizes[lo] + max_bytes, lo) - 1 - lo))
        try:
            outcome = _decided_prefix(ordered, lo, held, following, catalog, outside)
            if outcome is None:
                return last
            decided = list(_decided_outputs(outcome))
            full = full_decision(outcome)
            end = boundary(full)
            after = bisect_right(times, end, lo)  # the first record of the next round
            if after <= lo:
                raise ValueError(f"a round decided at {end} holds none of its records")
        except Exception as exc:
            if outside is not None:  # decided again from the records read again
                return last
            if on_error is None:
                raise
            yield from on_error(exc, ordered[lo:])
            return None
        yield from decided
        for i in range(lo + held, after):  # beyond the limits, not after the boundary
            yield from _beyond_limit(ordered[i], full, on_error)
        last, lo = end, after
    return last


def _decided_prefix(ordered: list[R.Record], lo: int, held: int, following: list[int],
                    catalog: Catalog, outside: int | None) -> Closed | Undefined | None:
    """``decide`` over the round's ``held`` records from ``lo``, reading only as far as the
    decision needs (``_rounds``); None when records not held could change it, or fall in it
    beyond its limits (``outside`` at or before the boundary)."""
    # the held prefix is known whole: every record left is held, or the limits end it here
    known = outside is None or held < len(ordered) - lo
    size = min(held, _WINDOW)
    while True:
        outcome = _decided(ordered[lo:lo + size], catalog)
        end = boundary(full_decision(outcome))
        whole = following[lo + size - 1] > end or (size == held and known)
        if whole and (outside is None or outside > end):
            return outcome
        if size == held:
            return None
        size = min(held, 2 * size)


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
