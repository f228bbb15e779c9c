"""The closing decision of docs/spec.md §2 and §4 over one join's records (no Beam import).

``decide(records, catalog, horizon)`` walks the join's candidate times in order (every record's
event time and every ``opened_at`` a receipt carries; records of one millisecond are folded
together) with the definition in force at each time, and finds the least time ``t`` at which
the reducer over the records with effective event time <= ``t`` is complete (or, with
``fail_fast``, all required branches reported), no later than the deadline ``D``.

Guarantees:
- With ``horizon=None`` (every record of the join is known: bounded input) the result is the
  exact event-time close of docs/spec.md §4; it is a pure function of the set of records.
- With a finite ``horizon`` (the watermark: every record with event time <= horizon is known)
  the decision never depends on records after the horizon unless the join's ``close_trigger``
  is ``eager``: an eager join closes at the first closable point among the records received,
  without waiting (also under a definition that records moved ``D`` behind themselves:
  docs/spec.md §2, step 2); a ``watermark`` join only when that point is <= horizon.
- ``closed_at <= D`` of the closing definition, always, and ``closed_at >= opened_at``.
  The close holds exactly the records with effective event time (``max(event_time,
  opened_at)``) <= ``closed_at``; every other record of the join is late: reason
  ``after_deadline`` if its event time > ``D``, else ``after_close``.
- A deadline close happens only once the horizon reaches ``D``; it closes at ``D`` with reason
  ``partial`` (``allow_partial``) or ``timeout``. A join that is still undefined at ``D`` (no
  ``required`` from any source) is ``Undefined``: its records up to ``D`` are rejected with
  ``undefined_join`` and the later ones form a fresh join.
- Records that move ``D`` before their own event time (a contract with a shorter deadline, an
  earlier ``opened_at``) are late; the join closes at once, under the new definition, at the
  least closable time in ``[opened_at, D]``, else at ``D`` (docs/spec.md §2).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog
from fanin.core.close import close_object
from fanin.core.reducer import JoinReducer

__all__ = ["Closed", "Pending", "Undefined", "decide", "late_reason"]


@dataclass(frozen=True)
class Closed:
    """The join closes: ``close`` is the docs/spec.md §5 object; ``late`` are (record, reason);
    ``reopened`` are the records after the tombstone (event time after both ``D +
    retention_s`` and ``decided_at``), which start the next join; ``decided_at`` is the time
    the walk decided at (``closed_at``, ``D``, or the time of records that moved ``D``)."""

    close: dict[str, Any]
    closed_at: int
    deadline: int
    reason: str
    retention_ms: int
    late: list[tuple[R.Record, str]]
    reopened: list[R.Record]
    decided_at: int

    @property
    def tombstone_end(self) -> int:
        """The end of the tombstone: records after it start the next join."""
        return _tombstone_end(self.deadline, self.retention_ms, self.decided_at)


@dataclass(frozen=True)
class Undefined:
    """No ``required`` set by the deadline: ``rejected`` go to dead-letter, ``rest`` (after
    ``decided_at``: ``D``, or the time of records that moved ``D``) form the next join."""

    rejected: list[R.Record]
    rest: list[R.Record]
    deadline: int
    decided_at: int


@dataclass(frozen=True)
class Pending:
    """Not decidable yet; ask again once the horizon reaches ``wake_at``."""

    wake_at: int


_TIME = R.TIME
_BY_TIME = itemgetter(_TIME)


def late_reason(time: int, deadline: int) -> str:
    return "after_deadline" if time > deadline else "after_close"


def _closed(reducer: JoinReducer, closed_at: int, ordered: list[R.Record], start: int,
            deadline: int, decided_at: int) -> Closed:
    defn = reducer.definition
    reason = reducer.reason()
    expiry = _tombstone_end(deadline, defn.retention_ms, decided_at)
    late = [(rec, late_reason(rec[_TIME], deadline)) for rec in ordered[start:]
            if rec[_TIME] <= expiry]
    reopened = [rec for rec in ordered[start:] if rec[_TIME] > expiry]
    return Closed(close_object(reducer, closed_at, reason), closed_at, deadline, reason,
                  defn.retention_ms, late, reopened, decided_at)


def _tombstone_end(deadline: int, retention_ms: int, decided_at: int) -> int:
    """``D + retention_s``, and never before the time the join was decided at."""
    return max(deadline + retention_ms, decided_at)


def _candidate_times(ordered: list[R.Record]) -> list[int]:
    """The times at which the join's state can change: every record's event time and every
    ``opened_at`` a receipt carries (records before ``opened_at`` count at ``opened_at``)."""
    times = {record[_TIME] for record in ordered}
    times.update(record[R.R_OPENED_AT] for record in ordered
                 if record[R.KIND] != R.OPEN and record[R.R_OPENED_AT] is not None)
    return sorted(times)


def decide(records: list[R.Record], catalog: Catalog, horizon: int | None
           ) -> Closed | Undefined | Pending:
    """Decide the close of one join from its records; see the module docstring.

    The walk of docs/spec.md §2 "Definition over time": at each candidate time ``t`` in
    order, first the deadline ``D`` in force (of the records before ``t``) is checked — past
    it, the join was decided at ``D``; then the records at ``t`` are folded; if they moved
    ``D`` before ``t`` the join closes at once under the new definition (``_moved_behind``);
    else it closes at ``t`` when ``t >= opened_at`` and the reducer is closable.
    """
    ordered = sorted(records, key=_BY_TIME)
    reducer = JoinReducer(catalog)
    add = reducer.add
    i, n = 0, len(ordered)
    deadline: int | None = None  # D of the definition in force
    for t in _candidate_times(ordered):
        if deadline is not None and t > deadline:
            return _at_deadline(reducer, ordered, i, deadline, horizon)
        j = i
        while j < n and ordered[j][_TIME] == t:
            j += 1
        if j == i + 1:
            add(ordered[i])
        elif j > i:  # the records of one millisecond, folded together
            reducer.add_all(ordered[i:j])
        i = j
        if not i:  # a receipt's opened_at before every record: nothing is known yet
            continue
        deadline = _deadline(reducer)
        if deadline < t:
            return _moved_behind(reducer, ordered, i, t, horizon)
        if reducer.closable() and t >= _opened_at(reducer):
            if horizon is None or t <= horizon or \
                    reducer.definition.close_trigger == "eager":
                return _closed(reducer, t, ordered, i, deadline, t)
            return Pending(t)
    if deadline is None:
        raise ValueError("decide() needs at least one record")
    return _at_deadline(reducer, ordered, n, deadline, horizon)


def _deadline(reducer: JoinReducer) -> int:
    deadline = reducer.deadline()
    if deadline is None:
        raise ValueError("a join with records has a deadline")
    return deadline


def _opened_at(reducer: JoinReducer) -> int:
    opened = reducer.opened_at()
    if opened is None:
        raise ValueError("a join with records has an opened_at")
    return opened


def _moved_behind(reducer: JoinReducer, ordered: list[R.Record], i: int, t: int,
                  horizon: int | None) -> Closed | Undefined | Pending:
    """The records at ``t`` moved ``D`` before ``t``: decide under the new definition.

    The join closes at the least time in ``[opened_at, D]`` at which the reducer under the new
    definition, over the records with effective event time up to it, is closable, else at
    ``D``; the records at ``t`` (and any others after ``D``) are late. An undefined join
    rejects every record up to ``t``. Needs every record up to ``t`` (``horizon >= t``),
    except that an ``eager`` definition closes at once when the records received make it
    closable (docs/spec.md §4): the reducer under it over every record received up to ``D``
    is closable, and the close is at the least closable time among them. Else (a record
    received that breaks completeness, only an earlier prefix closable; a close at ``D``; an
    undefined join) it waits for the horizon.
    """
    waits = horizon is not None and horizon < t
    defn = reducer.definition
    if waits and defn.close_trigger != "eager":
        return Pending(t)
    opened, deadline = _opened_at(reducer), _deadline(reducer)
    if defn.required is None:
        return Pending(t) if waits else Undefined(ordered[:i], ordered[i:], deadline, t)
    if waits and not _all_closable(reducer, ordered[:i], opened, deadline):
        return Pending(t)
    pinned = JoinReducer(reducer.catalog)
    pinned.pin(defn, opened, ordered[0][R.JOIN_ID])
    j = 0
    at = opened
    while True:
        while j < i and ordered[j][_TIME] <= at:
            pinned.add(ordered[j])
            j += 1
        if pinned.closable():
            return _closed(pinned, at, ordered, j, deadline, t)
        if j == i or ordered[j][_TIME] > deadline:
            return Pending(t) if waits else _closed(pinned, deadline, ordered, j, deadline, t)
        at = ordered[j][_TIME]


def _all_closable(reducer: JoinReducer, received: list[R.Record], opened: int, deadline: int
                  ) -> bool:
    """The reducer under ``reducer``'s definition (pinned at ``opened``) over the records of
    ``received`` with event time up to ``deadline`` is closable."""
    whole = JoinReducer(reducer.catalog)
    whole.pin(reducer.definition, opened, received[0][R.JOIN_ID])
    for record in received:
        if record[_TIME] <= deadline:
            whole.add(record)
    return whole.closable()


def _at_deadline(reducer: JoinReducer, ordered: list[R.Record], i: int, deadline: int,
                 horizon: int | None) -> Closed | Undefined | Pending:
    """The watermark passes ``D`` of the definition in force, ``ordered[:i]`` folded."""
    if horizon is not None and horizon < deadline:
        return Pending(deadline)
    if not reducer.defined():
        return Undefined(ordered[:i], ordered[i:], deadline, deadline)
    return _closed(reducer, deadline, ordered, i, deadline, deadline)
