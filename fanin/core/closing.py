"""The closing decision of SPEC §4 over one join's records (no Beam import).

``decide(records, catalog, horizon)`` folds the records in event-time order (ties: all records
of one millisecond are folded together) and finds the least time ``t`` at which the reducer
over the records with event time <= ``t`` is complete (or, with ``fail_fast``, all required
branches reported), before the deadline ``D`` of the records folded so far.

Guarantees:
- With ``horizon=None`` (every record of the join is known: bounded input) the result is the
  exact event-time close of SPEC §4; it is a pure function of the set of records.
- With a finite ``horizon`` (the watermark: every record with event time <= horizon is known)
  the decision never depends on records after the horizon unless the join's ``close_trigger``
  is ``eager``: an eager join closes at the first closable point among the records received,
  without waiting; a ``watermark`` join only when that point is <= horizon.
- A deadline close happens only once the horizon reaches ``D``; it closes at ``D`` with reason
  ``partial`` (``allow_partial``) or ``timeout``. A join that is still undefined at ``D`` (no
  ``required`` from any source) is ``Undefined``: its records up to ``D`` are rejected with
  ``undefined_join`` and the later ones form a fresh join.
- ``closed_at`` is never before the join's ``opened_at`` (records with an earlier event time
  count as at ``opened_at``). Records with event time > ``closed_at`` are late: reason
  ``after_deadline`` if their event time > ``D``, else ``after_close``.

Choice where SPEC is silent (docs/semantics.md): the join's definition and deadline at time
``t`` are those of the records with event time <= ``t``.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog
from fanin.core.reducer import JoinReducer

__all__ = ["Closed", "Pending", "Undefined", "decide", "decide_all", "late_reason"]


@dataclass(frozen=True)
class Closed:
    """The join closes: ``close`` is the SPEC §5 object; ``late`` are (record, reason)."""

    close: dict[str, Any]
    closed_at: int
    deadline: int
    reason: str
    retention_ms: int
    late: list[tuple[R.Record, str]]


@dataclass(frozen=True)
class Undefined:
    """No ``required`` set by the deadline: ``rejected`` go to dead-letter, ``rest`` stay."""

    rejected: list[R.Record]
    rest: list[R.Record]
    deadline: int


@dataclass(frozen=True)
class Pending:
    """Not decidable yet; ask again once the horizon reaches ``wake_at`` (None: no records)."""

    wake_at: int | None


_TIME = R.TIME
_BY_TIME = itemgetter(_TIME)


def late_reason(time: int, deadline: int) -> str:
    return "after_deadline" if time > deadline else "after_close"


def _closed(reducer: JoinReducer, closed_at: int, ordered: list[R.Record], start: int,
            deadline: int) -> Closed:
    defn = reducer.definition
    reason = reducer.reason()
    late = [(rec, late_reason(rec[_TIME], deadline)) for rec in ordered[start:]]
    return Closed(reducer.close(closed_at, reason), closed_at, deadline, reason,
                  defn.retention_ms, late)


def decide(records: list[R.Record], catalog: Catalog, horizon: int | None
           ) -> Closed | Undefined | Pending:
    """Decide the close of one join from its records; see the module docstring."""
    ordered = sorted(records, key=_BY_TIME)
    reducer = JoinReducer(catalog)
    add = reducer.add
    i, n = 0, len(ordered)
    while i < n:
        t = ordered[i][_TIME]
        if i:  # the deadline of the records folded so far
            deadline = reducer.deadline()
            assert deadline is not None
            if t > deadline:
                return _at_deadline(reducer, ordered, i, deadline, horizon)
        add(ordered[i])
        i += 1
        while i < n and ordered[i][_TIME] == t:
            add(ordered[i])
            i += 1
        if reducer.closable():
            opened = reducer.opened_at()
            assert opened is not None
            closed_at = max(t, opened)
            if horizon is None or closed_at <= horizon or \
                    reducer.definition.close_trigger == "eager":
                deadline = reducer.deadline()
                assert deadline is not None
                return _closed(reducer, closed_at, ordered, i, deadline)
            return Pending(closed_at)
    if reducer.is_empty():
        return Pending(None)
    deadline = reducer.deadline()
    assert deadline is not None
    return _at_deadline(reducer, ordered, n, deadline, horizon)


def _at_deadline(reducer: JoinReducer, ordered: list[R.Record], i: int, deadline: int,
                 horizon: int | None) -> Closed | Undefined | Pending:
    if horizon is not None and horizon < deadline:
        return Pending(deadline)
    if not reducer.defined():
        return Undefined(ordered[:i], ordered[i:], deadline)
    return _closed(reducer, deadline, ordered, i, deadline)


def decide_all(records: list[R.Record], catalog: Catalog
               ) -> tuple[Closed | None, list[R.Record]]:
    """Bounded input: the close of a join (or None) and the records rejected as undefined."""
    rejected: list[R.Record] = []
    while records:
        outcome = decide(records, catalog, None)
        if isinstance(outcome, Closed):
            return outcome, rejected
        if isinstance(outcome, Undefined):
            rejected.extend(outcome.rejected)
            records = outcome.rest
            continue
        break  # Pending with horizon None only happens for no records
    return None, rejected
