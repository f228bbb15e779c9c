"""The streaming plan (``fanin.transforms.join``): ``JoinDoFn``, a stateful DoFn with
event-time timers in the global window. See its docstring for what it guarantees."""

from __future__ import annotations

import random
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.coders import coders
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog
from fanin.core.bounded import UNDEFINED_DETAIL, arrival_order, held_count, message_bytes
from fanin.core.closing import Closed, Pending, Undefined, decide, late_reason
from fanin.core.full_join import beyond_limit_outputs, boundary, full_decision
from fanin.core.outcomes import LATE, closed_outputs, late_object, rejected_outputs
from fanin.core.reducer import JoinReducer
from fanin.transforms.join_outputs import (
    DEFAULT_MAX_BYTES_PER_JOIN,
    _all,
    _core,
    _Counting,
    _internal_errors,
    _JoinFailed,
)

__all__ = ["JoinDoFn"]

_MAX_TS_MS = GlobalWindow().max_timestamp().micros // 1000 - 1
_NO_HORIZON = -(2**62)  # nothing is known to be complete before the first timer fires
_WALK_LIMIT = 1_000  # records up to which an out-of-order arrival re-walks the decision

# META, the streaming join's bookkeeping (one list, one state read and write per arrival):
# EPOCH  random id of the bag's current contents (the reducer cache is valid for one epoch)
# COUNT  records in the bag
# HORIZON the watermark as last seen by a timer (every record up to it is known)
# WAKE   the time the DECIDE timer is set for, or None
# TOMB   after a close: [close reason, closed_at, D, D + retention], else None
# FULL   once the bag holds max_messages_per_join records, the final decision over them:
#        [closed_at, D, close reason, tombstone end] of a close (an earlier Fanin wrote no
#        tombstone end), or [None, D, None] of an undefined join
# BYTES  UTF-8 bytes of the messages in the bag; max_bytes_per_join once a message did not fit
#        (the bag is full: like COUNT at the message limit, it stays full)
EPOCH, COUNT, HORIZON, WAKE, TOMB, FULL, BYTES = range(7)
_META_DEFAULTS = (None, 0)  # FULL, BYTES of a META written by an earlier Fanin (see _read_meta)


# join id -> (epoch, count, reducer, the bag's records in bag order, their latest event time,
# the last decision over them when it was Pending: (the horizon it was asked at, its wake_at))
_Entry = tuple[int, int, JoinReducer, list[R.Record], int, tuple[int, int] | None]
_Cache = OrderedDict[str, _Entry]
# The reducer caches of this process, by JoinDoFn token (the last _MAX_CACHES used). The local
# runner runs every bundle with a fresh unpickled copy of the DoFn; copies of one JoinDoFn share
# its token, so its cache lives across bundles (and timers) there as well.
_CACHES: OrderedDict[str, _Cache] = OrderedDict()
_MAX_CACHES = 4


def _shared_cache(token: str) -> _Cache:
    """The reducer cache of the JoinDoFn (and its copies) of ``token`` in this process."""
    cache = _CACHES.get(token)
    if cache is None:
        cache = _CACHES[token] = OrderedDict()
        while len(_CACHES) > _MAX_CACHES:
            _CACHES.popitem(last=False)
    else:
        _CACHES.move_to_end(token)
    return cache


def _read_meta(meta: Any) -> list[Any] | None:
    """META, with the slots an earlier Fanin did not write (after ``--update``) defaulted."""
    value = meta.read()
    if value is not None and len(value) <= BYTES:
        value = [*value, *_META_DEFAULTS[len(value) - FULL:]]
    return value


class JoinDoFn(_Counting):
    """The streaming join: per ``join_id`` state in the global window, event-time timers.

    State: ``MSGS`` (bag of the join's records), ``META`` (bookkeeping; its slots are named
    by the module's ``EPOCH`` ... ``BYTES`` constants). Timers: ``DECIDE`` (event time: the
    next time the closing decision must be re-asked) and ``EXPIRE`` (event time: tombstone end
    ``D + retention``).

    ``input_end_ms``: for a finite stream (a replay), the last watermark before the jump to
    +infinity that ends it; None (Pub/Sub) when unknown.

    Guarantees:
    - ``eager`` joins close in ``process`` the moment the records received make them closable;
      ``watermark`` joins close when the watermark passes the close time. Deadline closes fire
      when the watermark passes ``D`` (timers are set 1 ms after the time they decide, so a
      record with event time exactly ``D`` is still included).
    - A join closes at most once while its tombstone lives (until the watermark passes
      ``D + retention_s``). Records for a tombstoned join with event time up to the
      tombstone's end go to ``late``; later ones (received before the watermark passed that
      end: a disorder allowance, or received before the close) wait in the bag and start the
      next join when ``EXPIRE`` fires, as in the bounded plan; one that does not fit the
      per-join limits there is classified by that join's final decision, as the bounded
      plan's next round does (``_tombstoned``).
    - A tombstone is dropped by its ``EXPIRE`` timer, except one that ends at or after
      ``input_end_ms``: no record can arrive after the watermark passed its end, so dropping
      it cannot change any output, and it stays (without a timer) until the job ends. On a
      replay that spares the runner a timer per closed join (the local runner copies and
      scans every key's timers: docs/performance.md) and a firing per join at the end.
    - Every record received ends in exactly one output: in a close's ``counts.messages``, in
      ``late`` or in ``dead_letter`` (undefined joins, or beyond ``max_messages_per_join``
      or ``max_bytes_per_join``:
      ``_overflow`` applies the same rule as the bounded plan, so a replay of input sorted by
      event time gives the bounded result).
    - The order-independent reducer over the received records is cached per worker (LRU,
      validated against the state's epoch and count), with the records in bag order, so each
      arrival costs O(1) amortised and a decision on a cached join does not decode its bag;
      the cache is only an accelerator: state is the truth, a miss rebuilds from the bag.
      Copies of one JoinDoFn in a process share its cache (``_shared_cache``).
    """

    MSGS = userstate.BagStateSpec("msgs", coders.FastPrimitivesCoder())
    META = userstate.ReadModifyWriteStateSpec("meta", coders.FastPrimitivesCoder())
    DECIDE = userstate.TimerSpec("decide", TimeDomain.WATERMARK)
    EXPIRE = userstate.TimerSpec("expire", TimeDomain.WATERMARK)

    def __init__(self, catalog: Catalog, max_messages: int, cache_size: int = 20_000,
                 max_bytes: int = DEFAULT_MAX_BYTES_PER_JOIN, log_closes: bool = False,
                 input_end_ms: int | None = None) -> None:
        self._catalog = catalog
        self._input_end_ms = input_end_ms
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._log_closes = log_closes
        self._cache_size = cache_size
        self._token = uuid.uuid4().hex  # names this DoFn's cache (kept by its copies)
        self._cache: _Cache = OrderedDict()  # the shared one once set up
        self._holding = False  # whether the record process() is handling is in the bag yet

    def setup(self) -> None:
        self._cache = _shared_cache(self._token)

    # --------------------------------------------------------------------- helpers
    @staticmethod
    def _clear(msgs: Any, meta: Any, decide_timer: Any, expire_timer: Any) -> None:
        """The one place that drops all of a join's state and timers."""
        msgs.clear()
        meta.clear()
        decide_timer.clear()
        expire_timer.clear()

    def _rebuild(self, join_id: str, epoch: int, count: int, records: list[R.Record]
                 ) -> JoinReducer:
        """A cache miss: fold the bag's records into a fresh reducer and remember it."""
        reducer = _core(JoinReducer, self._catalog)
        _core(reducer.add_all, records)  # (its opens recount the join once)
        self._remember(join_id, epoch, count, reducer, records,
                       max(record[R.TIME] for record in records))
        return reducer

    def _remember(self, join_id: str, epoch: int, count: int, reducer: JoinReducer,
                  records: list[R.Record], latest: int,
                  pending: tuple[int, int] | None = None) -> None:
        self._cache[join_id] = (epoch, count, reducer, records, latest, pending)
        self._cache.move_to_end(join_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _cached(self, join_id: str, epoch: int, count: int) -> _Entry | None:
        """The cache's entry for ``join_id`` when it holds the state's epoch and count."""
        cached = self._cache.get(join_id)
        return cached if cached is not None and cached[0] == epoch and cached[1] == count \
            else None

    def _decision(self, join_id: str, epoch: int, count: int, records: list[R.Record],
                  horizon: int) -> Closed | Undefined | Pending:
        """``decide(records, catalog, horizon)``, remembered while it is ``Pending``.

        A decision ``Pending(w)`` at a horizon depends only on the records with event time up
        to ``w``: the walk (``decide``) returns at ``w`` or before, and the candidate times a
        later record adds (its ``opened_at``) fold nothing and keep the reducer as it was.
        So while the horizon stays and every record added since has an event time after
        ``w`` (``_arrive`` forgets it otherwise), the decision is still ``Pending(w)``: a join
        that arrivals after its pending time keep asking (an ``eager`` join receiving records
        after ``D``) decides in O(1), not by walking all it holds each time (quadratic). Only
        for ``records`` that are the cache's entry for this epoch and count."""
        entry = self._cached(join_id, epoch, count)
        if entry is not None and entry[3] is not records:
            entry = None
        if entry is not None and entry[5] is not None and entry[5][0] == horizon:
            return Pending(entry[5][1])
        outcome = _core(decide, records, self._catalog, horizon)
        if isinstance(outcome, Pending) and entry is not None:
            self._cache[join_id] = (*entry[:5], (horizon, outcome.wake_at))
        return outcome

    def _records(self, join_id: str, value: list[Any], msgs: Any) -> list[R.Record]:
        """The bag's records: the cached list when the cache holds this epoch and count."""
        cached = self._cached(join_id, value[EPOCH], value[COUNT])
        return cached[3] if cached is not None else list(msgs.read())

    @staticmethod
    def _decide_now(reducer: JoinReducer, record: R.Record, horizon: int, wake: int | None,
                    count: int) -> bool:
        """Whether a closable join must run the closing decision on this arrival.

        Eager joins always do (they close now; ``_decision`` answers at once while a pending
        decision stands). A watermark join whose decision timer is already pending at
        ``wake`` need not when the record is not earlier than ``wake``: it cannot change what
        is decided before ``wake``, and the timer re-decides with it. This keeps a hot
        watermark join from re-deciding on every arrival. Nor, holding ``_WALK_LIMIT``
        records or more (``count``, before this one), when it is earlier (out of event-time
        order): the timer decides over all it holds then, where deciding on each such
        arrival walked every record each time (docs/spec.md §4).
        """
        if reducer.definition.close_trigger == "eager":
            return True
        return wake is None or wake <= horizon or (record[R.TIME] < wake and
                                                   count < _WALK_LIMIT)

    def _moved_behind_now(self, join_id: str, epoch: int, count: int, records: list[R.Record],
                          reducer: JoinReducer, latest: int, horizon: int) -> bool:
        """Whether an ``eager`` join whose ``D`` lies before its latest record closes on this
        arrival: records moved ``D`` behind themselves (docs/spec.md §2, step 2) and the
        records received make the join closable under the new definition (§4, eager). Not
        for a record that merely arrives after ``D`` (a closable prefix before a record that
        breaks completeness waits for ``D``). Asked of joins of up to ``_WALK_LIMIT`` records,
        as the other decisions on out-of-order arrivals (the walk reads every record)."""
        if reducer.definition.close_trigger != "eager":
            return False
        deadline = _core(reducer.deadline)
        if deadline is None or deadline >= latest:
            return False
        outcome = self._decision(join_id, epoch, count, records, horizon)
        return isinstance(outcome, Closed) and outcome.decided_at > outcome.deadline

    def _first_decision(self, records: list[R.Record], deadline: int) -> int:
        """The first time the closing decision over ``records`` can be made: a close time of
        a prefix, or an earlier ``D`` in force before later records moved it (docs/spec.md §2,
        definition over time). Only asked for a record that arrives out of event-time order:
        in order, the pending ``DECIDE`` was set for the earlier decision points already. An
        ``eager`` join whose prefix was closable before a conflicting record waits for ``D``
        (docs/spec.md §4), so only a pending time counts. The walk reads every record (about
        1 µs each): a join holding ``_WALK_LIMIT`` records or more waits for ``D`` of them all,
        or for all of them to be closable, as docs/spec.md §4 says."""
        outcome = _core(decide, records, self._catalog, _NO_HORIZON)
        return outcome.wake_at if isinstance(outcome, Pending) else deadline

    @staticmethod
    def _set(timer: Any, ms: int) -> None:
        timer.set(Timestamp(micros=min(ms, _MAX_TS_MS) * 1000))

    def _settle(self, join_id: str, records: list[R.Record], meta_value: list[Any],
                msgs: Any, meta: Any, decide_timer: Any, expire_timer: Any) -> Iterator[Any]:
        """Ask the closing decision at the known horizon and apply what it says.

        Exits: a close (bag cleared, tombstone written, EXPIRE set if it can fire before the
        input ends); an undefined join (its
        records rejected, the rest decided again as a fresh join); pending (DECIDE set to the
        time to ask again, META written); or nothing left (all state and timers cleared).
        """
        epoch, count, horizon, wake = meta_value[EPOCH], meta_value[COUNT], \
            meta_value[HORIZON], meta_value[WAKE]
        size = meta_value[BYTES]
        while records:
            outcome = self._decision(join_id, epoch, count, records, horizon)
            if isinstance(outcome, Closed):
                outputs = _core(_all, closed_outputs, outcome)  # before the state changes
                self._cache.pop(join_id, None)
                msgs.clear()
                decide_timer.clear()
                # records already here but after the tombstone's end wait in the bag for it
                # to expire: they start the next join (as in the bounded plan)
                for record in outcome.reopened:
                    msgs.add(record)
                expiry = outcome.tombstone_end
                meta.write([epoch, len(outcome.reopened), horizon, None,
                            [outcome.reason, outcome.closed_at, outcome.deadline, expiry], None,
                            sum(message_bytes(r) for r in outcome.reopened)])
                if self._input_end_ms is None or expiry + 1 <= self._input_end_ms or \
                        outcome.reopened:
                    self._set(expire_timer, expiry + 1)
                yield from self._emit(outputs)
                return
            if isinstance(outcome, Undefined):
                yield from self._emit(rejected_outputs(outcome.rejected, "undefined_join",
                                                       UNDEFINED_DETAIL))
                records = outcome.rest
                self._cache.pop(join_id, None)
                epoch, count = random.getrandbits(62), len(records)
                size = sum(message_bytes(r) for r in records)
                msgs.clear()
                for record in records:
                    msgs.add(record)
                continue
            target = outcome.wake_at if wake is None or wake <= horizon \
                else min(wake, outcome.wake_at)
            self._set(decide_timer, target + 1)
            meta.write([epoch, count, horizon, target, None, None, size])
            return
        self._clear(msgs, meta, decide_timer, expire_timer)

    def _overflow(self, join_id: str, record: R.Record, value: list[Any], msgs: Any,
                  meta: Any, decide_timer: Any, expire_timer: Any) -> Iterator[Any]:
        """A record for a join whose bag is full (docs/spec.md §4, per-join limit).

        The bag can take no more records, so the decision over it is final whatever the
        watermark; it is computed once and kept in META. Exits: late (the join closes before
        the record's event time); the next join (an undefined join decided before it: that
        join is settled now and the record starts the next one); else ``join_too_large``.
        """
        full = self._full_decision(value, msgs, meta)
        end = boundary(full)
        if record[R.TIME] > end:
            # after the decided join: the record starts the next one, so the final decision
            # is applied now (the close or the rejection, at the horizon it was made at)
            msgs.add(record)
            self._holding = True
            value[COUNT] += 1
            value[BYTES] += message_bytes(record)
            value[HORIZON] = max(value[HORIZON], end)
            value[FULL] = None
            yield from self._settle(join_id, list(msgs.read()), value, msgs, meta,
                                    decide_timer, expire_timer)
        else:
            yield from self._emit(_core(beyond_limit_outputs, record, full))

    def _full_decision(self, value: list[Any], msgs: Any, meta: Any) -> list[Any]:
        """``FULL``: the final decision over a full bag (computed once, then kept in META)."""
        full = value[FULL]
        if full is None:
            outcome = _core(decide, list(msgs.read()), self._catalog, None)
            if not isinstance(outcome, (Closed, Undefined)):
                raise ValueError(f"a full join must be decided, not {outcome!r}")
            full = full_decision(outcome)
            value[FULL] = full
            meta.write(value)
        return list(full)

    def _tombstoned(self, record: R.Record, value: list[Any], tomb: list[Any], msgs: Any,
                    meta: Any, expire_timer: Any) -> Iterator[Any]:
        """A record for a closed join. Up to the tombstone's end it is late. After it, it
        belongs to the next join, which starts when the watermark passes that end: the record
        waits in the bag for ``EXPIRE`` (``on_expire`` decides the next join). When the next
        join's bag is full, its decision over what it holds is final (``FULL``), and the record
        is what the bounded plan makes of it: late of that join if after its close and within
        its tombstone; held for the join after it if after that (beyond the limit, until
        ``EXPIRE`` settles the next join, which leaves it for the one after); else
        ``join_too_large``."""
        close_reason, _, deadline, expiry = tomb
        time = record[R.TIME]
        if time <= expiry:
            yield from self._emit([(LATE, _core(late_object, record,
                                                late_reason(time, deadline), close_reason))])
            return
        size = value[BYTES] + message_bytes(record)
        if value[COUNT] >= self._max_messages or (value[COUNT] and size > self._max_bytes):
            value[BYTES] = max(value[BYTES], self._max_bytes)  # full: stays full
            full = self._full_decision(value, msgs, meta)
            end = boundary(full)
            if time <= end:
                meta.write(value)
                yield from self._emit(_core(beyond_limit_outputs, record, full))
                return
            size = value[BYTES] + message_bytes(record)
        msgs.add(record)
        self._holding = True
        value[COUNT] += 1
        value[BYTES] = size
        meta.write(value)
        self._set(expire_timer, expiry + 1)  # set already unless it ends after the input

    def _poisoned(self, join_id: str, extra: list[R.Record], failed: _JoinFailed, msgs: Any,
                  meta: Any, decide_timer: Any, expire_timer: Any) -> Iterator[Any]:
        """The core failed on this join: every record it holds, and ``extra`` (the arriving
        record when it is not held yet), go to ``dead_letter`` as ``internal_error``; the
        join's state, timers and cached reducer are dropped (a later record starts afresh)."""
        records = [*msgs.read(), *extra]
        self._cache.pop(join_id, None)
        self._clear(msgs, meta, decide_timer, expire_timer)
        yield from self._emit(_internal_errors(failed.__cause__, records))

    # --------------------------------------------------------------------- callbacks
    def process(self, element: tuple[str, R.Record],
                msgs: Any = beam.DoFn.StateParam(MSGS),
                meta: Any = beam.DoFn.StateParam(META),
                decide_timer: Any = beam.DoFn.TimerParam(DECIDE),
                expire_timer: Any = beam.DoFn.TimerParam(EXPIRE)) -> Iterator[Any]:
        """One arrival (``_arrive``); a failure of the core poisons this join only."""
        self._holding = False  # set once the arriving record is in the bag
        try:
            yield from self._arrive(element, msgs, meta, decide_timer, expire_timer)
        except _JoinFailed as failed:
            yield from self._poisoned(element[0], [] if self._holding else [element[1]],
                                      failed, msgs, meta, decide_timer, expire_timer)

    def _arrive(self, element: tuple[str, R.Record], msgs: Any, meta: Any, decide_timer: Any,
                expire_timer: Any) -> Iterator[Any]:
        """One arrival. Exits: late (a tombstone: the join closed already); the per-join
        limit (``_overflow``); a decision now (the record is behind the known horizon, or the
        join became closable: ``_settle``); else the record waits in the bag with DECIDE set
        to the least of the pending wake time and the deadline."""
        join_id, record = element
        value = _read_meta(meta)
        if value is None:
            value = [random.getrandbits(62), 0, _NO_HORIZON, None, None, None, 0]
        tomb = value[TOMB]
        if tomb is not None:
            yield from self._tombstoned(record, value, tomb, msgs, meta, expire_timer)
            return
        epoch, count, horizon, wake = value[EPOCH], value[COUNT], value[HORIZON], value[WAKE]
        size = value[BYTES] + message_bytes(record)
        if count >= self._max_messages or (count and size > self._max_bytes):
            value[BYTES] = max(value[BYTES], self._max_bytes)  # full: stays full
            yield from self._overflow(join_id, record, value, msgs, meta, decide_timer,
                                      expire_timer)
            return
        cached = self._cached(join_id, epoch, count)
        msgs.add(record)
        self._holding = True
        if cached is not None:
            reducer, records, latest, pending = cached[2], cached[3], cached[4], cached[5]
            _core(reducer.add, record)
            records.append(record)
            latest = max(latest, record[R.TIME])
            # a pending decision stands for records after its time (``_decision``)
            self._remember(join_id, epoch, count + 1, reducer, records, latest,
                           pending if pending is not None and record[R.TIME] > pending[1]
                           else None)
        else:
            records = list(msgs.read())
            reducer = self._rebuild(join_id, epoch, count + 1, records)
            latest = self._cache[join_id][4]
        if record[R.TIME] <= horizon or (_core(reducer.closable) and self._decide_now(
                reducer, record, horizon, wake, count)) or (
                    count < _WALK_LIMIT and self._moved_behind_now(
                        join_id, epoch, count + 1, records, reducer, latest, horizon)):
            # _settle writes META (or clears the state) on every path
            yield from self._settle(join_id, records,
                                    [epoch, count + 1, horizon, wake, None, None, size], msgs,
                                    meta, decide_timer, expire_timer)
            return
        deadline = _core(reducer.deadline)
        if deadline is None:
            raise ValueError("a join with records has a deadline")
        if record[R.TIME] < latest and count < _WALK_LIMIT:  # out of event-time order
            deadline = min(deadline, self._first_decision(records, deadline))
        target = deadline if wake is None or wake <= horizon else min(wake, deadline)
        if target != wake:
            self._set(decide_timer, target + 1)
        meta.write([epoch, count + 1, horizon, target, None, None, size])  # one write/arrival

    @userstate.on_timer(DECIDE)
    def on_decide(self, key: Any = beam.DoFn.KeyParam, fired: Any = beam.DoFn.TimestampParam,
                  msgs: Any = beam.DoFn.StateParam(MSGS),
                  meta: Any = beam.DoFn.StateParam(META),
                  decide_timer: Any = beam.DoFn.TimerParam(DECIDE),
                  expire_timer: Any = beam.DoFn.TimerParam(EXPIRE)) -> Iterator[Any]:
        """The watermark passed a pending decision time: every record before it is known, so
        the horizon moves there and the decision is asked again (``_settle``). Nothing to do
        for a closed join (its tombstone waits for EXPIRE) or a cleared one."""
        value = _read_meta(meta)
        if value is None or value[TOMB] is not None:
            return
        value[HORIZON] = max(value[HORIZON], fired.micros // 1000 - 1)
        value[WAKE] = None
        try:
            yield from self._settle(key, self._records(key, value, msgs), value, msgs, meta,
                                    decide_timer, expire_timer)
        except _JoinFailed as failed:
            yield from self._poisoned(key, [], failed, msgs, meta, decide_timer, expire_timer)

    @userstate.on_timer(EXPIRE)
    def on_expire(self, key: Any = beam.DoFn.KeyParam,
                  msgs: Any = beam.DoFn.StateParam(MSGS),
                  meta: Any = beam.DoFn.StateParam(META),
                  decide_timer: Any = beam.DoFn.TimerParam(DECIDE),
                  expire_timer: Any = beam.DoFn.TimerParam(EXPIRE)) -> Iterator[Any]:
        """The tombstone's retention ended: drop it. Records after its end that arrived
        meanwhile start the next join (decided as any join, ``_settle``), which holds the
        first of them within the per-join limits; the others then arrive at it as any record
        does (``process``). With none, all of the join's state and timers are dropped."""
        self._cache.pop(key, None)
        value = _read_meta(meta)
        records = list(msgs.read())
        if value is None or not records:
            self._clear(msgs, meta, decide_timer, expire_timer)
            return
        expiry = value[TOMB][3] if value[TOMB] is not None else value[HORIZON]
        # they all start the next join at once: its first ones in the bounded order (the bag's
        # order is the runner's: Flink's is not the arrival order)
        records.sort(key=arrival_order)
        cut = held_count(records, self._max_messages, self._max_bytes)
        records, rest = records[:cut], records[cut:]
        if rest:  # held beyond the limit while the next join's decision was final
            msgs.clear()
            for record in records:
                msgs.add(record)
        fresh = [random.getrandbits(62), cut, max(value[HORIZON], expiry), None, None, None,
                 sum(message_bytes(r) for r in records)]
        try:
            yield from self._settle(key, records, fresh, msgs, meta, decide_timer, expire_timer)
        except _JoinFailed as failed:
            yield from self._poisoned(key, rest, failed, msgs, meta, decide_timer, expire_timer)
            return
        for record in rest:
            yield from self.process((key, record), msgs, meta, decide_timer, expire_timer)
