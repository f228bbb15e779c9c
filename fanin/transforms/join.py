"""Beam composites that join records by ``join_id``: a bounded plan and a streaming plan.

``JoinRecords(catalog, streaming=...)`` takes keyed input and returns a ``DoOutputsTuple``
with ``closes``, ``late`` and ``dead_letter`` outputs.

- Bounded (``streaming=False``): raw messages keyed by join_id (``KeyMessages``), a
  ``GroupByKey``, then each join's messages are parsed and the closing decision is taken over
  all of its records at once. This is the exact event-time result of docs/spec.md §4 and the
  fastest plan on the local runner (docs/beam-notes.md); the parity test in
  ``tests/pipeline/test_pipeline_runs.py`` proves it equals the streaming plan.
- Streaming (``streaming=True``): ``JoinDoFn``, a stateful DoFn in the global window. See its
  docstring for what it guarantees.

Metrics (namespace ``fanin``): ``closes.<reason>``, ``late.<reason>``,
``dead_letter.<error>``, distribution ``close.latency_ms``.

Poison-proof: an exception raised by the core while folding, deciding or encoding one join
(every such call goes through ``_core``) does not fail the bundle, which a runner would retry
forever in a stream. The records that join holds (and the one arriving) go to ``dead_letter``
with error ``internal_error`` (``detail``: the exception's type and first line), the join's
state is cleared, the counter ``dead_letter.internal_error`` grows, and the run goes on.
"""

from __future__ import annotations

import functools
import logging
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import coders
from apache_beam.metrics import Metrics
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import Timestamp

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog
from fanin.contracts.parsing import DEFAULT_MAX_BYTES, dead_letter, parse_message
from fanin.core.bounded import (
    TOO_LARGE_DETAIL,
    UNDEFINED_DETAIL,
    bounded_outputs,
    message_bytes,
)
from fanin.core.closing import Closed, Undefined, decide, late_reason
from fanin.core.outcomes import (
    CLOSES,
    DEAD_LETTER,
    LATE,
    closed_outputs,
    late_object,
    log_close,
    rejected_outputs,
)
from fanin.core.reducer import JoinReducer

__all__ = ["DEFAULT_MAX_BYTES_PER_JOIN", "JoinDoFn", "JoinRecords"]

_LOG = logging.getLogger(__name__)
_T = TypeVar("_T")
_INTERNAL = "internal_error"
# Dataflow refuses elements over ~80 MB and key commits over ~180 MB. A record in state takes
# ~4x its message's bytes (text, parsed value, canonical JSON: measured 3.8-4.0x), and a close
# carries its accepted values: 16 MiB of messages keeps a join's bag additions plus its close
# under ~85 MiB in one commit even when all its messages arrive in one bundle.
DEFAULT_MAX_BYTES_PER_JOIN = 16 * 1024 * 1024
_MAX_TS_MS = GlobalWindow().max_timestamp().micros // 1000 - 1
_NO_HORIZON = -(2**62)  # nothing is known to be complete before the first timer fires

# META, the streaming join's bookkeeping (one list, one state read and write per arrival):
# EPOCH  random id of the bag's current contents (the reducer cache is valid for one epoch)
# COUNT  records in the bag
# HORIZON the watermark as last seen by a timer (every record up to it is known)
# WAKE   the time the DECIDE timer is set for, or None
# TOMB   after a close: [close reason, closed_at, D, D + retention], else None
# FULL   once the bag holds max_messages_per_join records, the final decision over them:
#        [closed_at, D, close reason] of a close, or [None, D, None] of an undefined join
# BYTES  UTF-8 bytes of the messages in the bag; max_bytes_per_join once a message did not fit
#        (the bag is full: like COUNT at the message limit, it stays full)
EPOCH, COUNT, HORIZON, WAKE, TOMB, FULL, BYTES = range(7)
_META_DEFAULTS = (None, 0)  # FULL, BYTES of a META written by an earlier Fanin (see _read_meta)


_PROGRESS_EVERY = 10_000
_closed_here = 0  # closes emitted by this worker process, for the progress line
_LATENCY = Metrics.distribution("fanin", "close.latency_ms")


@functools.lru_cache(maxsize=256)
def _counter(name: str) -> Any:
    return Metrics.counter("fanin", name)


class _JoinFailed(Exception):
    """The core raised for one join (the original exception is the cause)."""


def _core(call: Callable[..., _T], *args: Any) -> _T:
    """``call(*args)`` (folding, deciding or encoding one join); any exception it raises
    becomes ``_JoinFailed``, which poisons that join only."""
    try:
        return call(*args)
    except _JoinFailed:
        raise
    except Exception as exc:
        raise _JoinFailed(exc) from exc


def _all(produce: Callable[..., Iterable[_T]], *args: Any) -> list[_T]:
    """Every item ``produce(*args)`` yields (for ``_core``: built whole, or not at all)."""
    return list(produce(*args))


def _internal_errors(records: Iterable[R.Record], failed: _JoinFailed
                     ) -> list[tuple[str, dict[str, Any]]]:
    """The ``internal_error`` dead letters of a poisoned join's records."""
    cause = failed.__cause__
    first = (str(cause).splitlines() or [""])[0][:200]
    detail = f"{type(cause).__name__}: {first}" if first else type(cause).__name__
    _LOG.warning("fanin: a join failed in the core (%s); its records go to dead_letter",
                 type(cause).__name__)
    return list(rejected_outputs(records, _INTERNAL, detail))


class _Counting(beam.DoFn):
    """A DoFn whose outputs are counted per bundle: ``_emit`` tallies them and the tally goes
    to the Beam counters ``closes.<reason>``, ``late.<reason>``, ``dead_letter.<error>`` once,
    in ``finish_bundle`` (a counter update per element costs as much as folding a join).
    Closes are logged (``fanin.close``) only when ``_log_closes`` (``--log-closes``): workers
    log at INFO, so the logger's level alone would log every close to Cloud Logging."""

    _log_closes = False

    def start_bundle(self) -> None:
        self._tally: dict[tuple[str, str], int] = {}

    def finish_bundle(self) -> None:
        for (tag, reason), count in self._tally.items():
            _counter(f"{tag}.{reason}").inc(count)
        self._tally = {}

    def _emit(self, outputs: Iterable[tuple[str, dict[str, Any]]]) -> Iterator[Any]:
        global _closed_here
        tally = self._tally
        for tag, obj in outputs:
            reason = obj["error"] if tag == DEAD_LETTER else obj["reason"]
            tally[tag, reason] = tally.get((tag, reason), 0) + 1
            if tag == CLOSES:
                _LATENCY.update(obj["latency_ms"])
                if self._log_closes:
                    log_close(obj)
                _closed_here += 1
                if _closed_here % _PROGRESS_EVERY == 0:
                    _LOG.info("fanin: %d joins closed by this worker", _closed_here)
                yield obj
            else:
                yield pvalue.TaggedOutput(tag, obj)


class _CloseGroups(_Counting):
    """The bounded plan's close step: one join's grouped messages -> its outputs.

    The messages arrive raw, keyed by ``KeyMessages`` (``fanin.transforms.parse``); each is
    parsed here (``parse_message``): its record joins, or its dead letter is emitted. A record
    whose join_id is not the group's key (which ``read_join_id`` rules out) is an
    ``internal_error`` dead letter, never folded into another join.

    Memory: a join within ``max_messages`` is parsed once and decided from a list of its
    records. A hot join (more messages than that) keeps no list: ``bounded_outputs`` reads its
    grouped messages again (parsed again, twice per decision) and holds only the first
    ``max_messages`` records; every output is emitted as it is made. Dead letters of the
    parse are emitted as they come.

    Poison-proof: an exception the core raises while deciding makes the records it had not
    put in an output yet ``internal_error`` dead letters (``bounded_outputs``' ``on_error``);
    outputs already emitted stand, so every record is in exactly one output.
    """

    class _Reparsed:
        """A hot join's records, parsed again from the grouped messages on each iteration
        (the records only: their dead letters were emitted by the first reading)."""

        def __init__(self, close: _CloseGroups, join_id: str,
                     grouped: Iterable[tuple[bytes | str, Any]]) -> None:
            self._close, self._join_id, self._grouped = close, join_id, grouped

        def __iter__(self) -> Iterator[R.Record]:
            for record, _ in self._close._parse(self._join_id, self._grouped):
                if record is not None:
                    yield record

    def __init__(self, catalog: Catalog, max_messages: int,
                 max_bytes: int = DEFAULT_MAX_BYTES_PER_JOIN, log_closes: bool = False,
                 max_message_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._catalog = catalog
        self._contracts = frozenset(catalog.contracts)
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._max_message_bytes = max_message_bytes
        self._log_closes = log_closes
        self._parsed = Metrics.counter("fanin", "messages.parsed")

    # A join's messages after its first _MEMO_AFTER are parsed through a memo of up to
    # _MEMO_SIZE texts: a hot join is mostly an agent repeating itself, and parse_message
    # depends on the source only in the record's SOURCE field
    _MEMO_AFTER, _MEMO_SIZE = 1_000, 4_096

    def _parse(self, join_id: str, grouped: Iterable[tuple[bytes | str, Any]]
               ) -> Iterator[tuple[R.Record | None, tuple[str, dict[str, Any]] | None]]:
        """Per grouped message: ``(its record, None)`` or ``(None, its dead letter)``."""
        contracts, limit = self._contracts, self._max_message_bytes
        memo: dict[bytes | str, R.Record] = {}
        for n, (data, source) in enumerate(grouped):
            if n >= self._MEMO_AFTER:
                known = memo.get(data)
                if known is not None:
                    yield (*known[:R.SOURCE], source, *known[R.SOURCE + 1:]), None
                    continue
            record, letter = parse_message(data, source, contracts, limit)
            if record is not None and record[R.JOIN_ID] == join_id:
                if n >= self._MEMO_AFTER:
                    if len(memo) >= self._MEMO_SIZE:
                        memo.clear()
                    memo[data] = record
                yield record, None
            elif record is not None:
                yield None, (DEAD_LETTER, dead_letter(
                    _INTERNAL, "join_id read differently before and after the shuffle", data,
                    source))
            elif letter is not None:
                yield None, (DEAD_LETTER, letter)

    @staticmethod
    def _poisoned(exc: Exception, records: Iterable[R.Record]
                  ) -> list[tuple[str, dict[str, Any]]]:
        """``on_error`` of ``bounded_outputs``: the records' ``internal_error`` dead letters."""
        failed = _JoinFailed(exc)
        failed.__cause__ = exc
        return _internal_errors(records, failed)

    def process(self, element: tuple[str, Iterable[tuple[bytes | str, Any]]]) -> Iterator[Any]:
        """The per-join limit (docs/spec.md §4): a join holds its first ``max_messages``
        records in arrival order (bounded input: event time, opens first, then the text), and
        no more than ``max_bytes`` of messages (the first record that does not fit ends it).
        A record beyond it is late if the join closed before its event time, starts the next
        join if an undefined join was decided before it, else it is ``join_too_large``. A
        record after a closed join's tombstone (``D + retention_s``) starts the next join, as
        in a stream whose watermark passed the tombstone's end before it arrived."""
        join_id, grouped = element
        records: list[R.Record] | None = []
        parsed = 0
        for record, letter in self._parse(join_id, grouped):
            if letter is not None:
                yield from self._emit((letter,))
            elif record is not None:
                parsed += 1
                if records is not None:
                    records.append(record)
                    if parsed > self._max_messages:
                        records = None  # a hot join: read again, never held whole
        self._parsed.inc(parsed)
        group = self._Reparsed(self, join_id, grouped) if records is None else records
        yield from self._emit(bounded_outputs(group, self._catalog, self._max_messages,
                                              self._max_bytes, on_error=self._poisoned))

def _read_meta(meta: Any) -> list[Any] | None:
    """META, with the slots an earlier Fanin did not write (after ``--update``) defaulted."""
    value = meta.read()
    if value is not None and len(value) <= BYTES:
        value = [*value, *_META_DEFAULTS[len(value) - FULL:]]
    return value


class JoinDoFn(_Counting):
    """The streaming join: per ``join_id`` state in the global window, event-time timers.

    State: ``MSGS`` (bag of the join's records), ``META`` (bookkeeping; its slots are named
    by the module's ``EPOCH`` ... ``FULL`` constants). Timers: ``DECIDE`` (event time: the
    next time the closing decision must be re-asked) and ``EXPIRE`` (event time: tombstone end
    ``D + retention``).

    Guarantees:
    - ``eager`` joins close in ``process`` the moment the records received make them closable;
      ``watermark`` joins close when the watermark passes the close time. Deadline closes fire
      when the watermark passes ``D`` (timers are set 1 ms after the time they decide, so a
      record with event time exactly ``D`` is still included).
    - A join closes at most once while its tombstone lives (until the watermark passes
      ``D + retention_s``). Records for a tombstoned join go to ``late``.
    - Every record received ends in exactly one output: in a close's ``counts.messages``, in
      ``late`` or in ``dead_letter`` (undefined joins, or beyond ``max_messages_per_join``
      or ``max_bytes_per_join``:
      ``_overflow`` applies the same rule as the bounded plan, so a replay of input sorted by
      event time gives the bounded result).
    - The order-independent reducer over the received records is cached per worker (LRU,
      validated against the state's epoch and count), so each arrival costs O(1) amortised;
      the cache is only an accelerator: state is the truth, a miss rebuilds from the bag.
    """

    MSGS = userstate.BagStateSpec("msgs", coders.FastPrimitivesCoder())
    META = userstate.ReadModifyWriteStateSpec("meta", coders.FastPrimitivesCoder())
    DECIDE = userstate.TimerSpec("decide", TimeDomain.WATERMARK)
    EXPIRE = userstate.TimerSpec("expire", TimeDomain.WATERMARK)

    def __init__(self, catalog: Catalog, max_messages: int, cache_size: int = 20_000,
                 max_bytes: int = DEFAULT_MAX_BYTES_PER_JOIN, log_closes: bool = False) -> None:
        self._catalog = catalog
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._log_closes = log_closes
        self._cache_size = cache_size
        self._cache: OrderedDict[str, tuple[int, int, JoinReducer]] = OrderedDict()
        self._holding = False  # whether the record process() is handling is in the bag yet

    def setup(self) -> None:
        self._cache = OrderedDict()

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
        for record in records:
            _core(reducer.add, record)
        self._remember(join_id, epoch, count, reducer)
        return reducer

    def _remember(self, join_id: str, epoch: int, count: int, reducer: JoinReducer) -> None:
        self._cache[join_id] = (epoch, count, reducer)
        self._cache.move_to_end(join_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    @staticmethod
    def _decide_now(reducer: JoinReducer, record: R.Record, horizon: int, wake: int | None
                    ) -> bool:
        """Whether a closable join must run the closing decision on this arrival.

        Eager joins always do (they close now). A watermark join whose decision timer is
        already pending at ``wake`` need not when the record is not earlier than ``wake``: it
        cannot change what is decided before ``wake``, and the timer re-decides with it. This
        keeps a hot watermark join from re-deciding on every arrival.
        """
        if reducer.definition.close_trigger == "eager":
            return True
        return wake is None or wake <= horizon or record[R.TIME] < wake

    @staticmethod
    def _set(timer: Any, ms: int) -> None:
        timer.set(Timestamp(micros=min(ms, _MAX_TS_MS) * 1000))

    def _settle(self, join_id: str, records: list[R.Record], meta_value: list[Any],
                msgs: Any, meta: Any, decide_timer: Any, expire_timer: Any) -> Iterator[Any]:
        """Ask the closing decision at the known horizon and apply what it says.

        Exits: a close (bag cleared, tombstone written, EXPIRE set); an undefined join (its
        records rejected, the rest decided again as a fresh join); pending (DECIDE set to the
        time to ask again, META written); or nothing left (all state and timers cleared).
        """
        epoch, count, horizon, wake = meta_value[EPOCH], meta_value[COUNT], \
            meta_value[HORIZON], meta_value[WAKE]
        size = meta_value[BYTES]
        while records:
            outcome = _core(decide, records, self._catalog, horizon)
            if isinstance(outcome, Closed):
                outputs = _core(_all, closed_outputs, outcome)  # before the state changes
                self._cache.pop(join_id, None)
                msgs.clear()
                decide_timer.clear()
                # records already here but after the tombstone's end: late as well (a stream
                # that delivers them after the tombstone expired starts the next join)
                outputs += [(LATE, late_object(r, late_reason(r[R.TIME], outcome.deadline),
                                               outcome.reason)) for r in outcome.reopened]
                expiry = max(outcome.deadline + outcome.retention_ms, outcome.decided_at)
                meta.write([epoch, 0, horizon, None,
                            [outcome.reason, outcome.closed_at, outcome.deadline, expiry], None,
                            0])
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
        full = value[FULL]
        if full is None:
            outcome = _core(decide, list(msgs.read()), self._catalog, None)
            if isinstance(outcome, Closed):
                full = [outcome.closed_at, outcome.deadline, outcome.reason]
            elif isinstance(outcome, Undefined):
                full = [None, outcome.decided_at, None]
            else:
                raise ValueError(f"a full join must be decided, not {outcome!r}")
            value[FULL] = full
            meta.write(value)
        closed_at, deadline, reason = full
        time = record[R.TIME]
        if closed_at is not None and time > closed_at:
            yield from self._emit([(LATE, _core(late_object, record,
                                                late_reason(time, deadline), reason))])
        elif closed_at is None and time > deadline:
            msgs.add(record)
            self._holding = True
            value[COUNT] += 1
            value[BYTES] += message_bytes(record)
            value[HORIZON] = max(value[HORIZON], deadline)
            value[FULL] = None
            yield from self._settle(join_id, list(msgs.read()), value, msgs, meta,
                                    decide_timer, expire_timer)
        else:
            yield from self._emit(rejected_outputs([record], "join_too_large", TOO_LARGE_DETAIL))

    def _poisoned(self, join_id: str, extra: list[R.Record], failed: _JoinFailed, msgs: Any,
                  meta: Any, decide_timer: Any, expire_timer: Any) -> Iterator[Any]:
        """The core failed on this join: every record it holds, and ``extra`` (the arriving
        record when it is not held yet), go to ``dead_letter`` as ``internal_error``; the
        join's state, timers and cached reducer are dropped (a later record starts afresh)."""
        records = [*msgs.read(), *extra]
        self._cache.pop(join_id, None)
        self._clear(msgs, meta, decide_timer, expire_timer)
        yield from self._emit(_internal_errors(records, failed))

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
            close_reason, _, deadline, _ = tomb
            late = _core(late_object, record, late_reason(record[R.TIME], deadline),
                         close_reason)
            yield from self._emit([(LATE, late)])
            return
        epoch, count, horizon, wake = value[EPOCH], value[COUNT], value[HORIZON], value[WAKE]
        size = value[BYTES] + message_bytes(record)
        if count >= self._max_messages or (count and size > self._max_bytes):
            value[BYTES] = max(value[BYTES], self._max_bytes)  # full: stays full
            yield from self._overflow(join_id, record, value, msgs, meta, decide_timer,
                                      expire_timer)
            return
        cached = self._cache.get(join_id)
        msgs.add(record)
        self._holding = True
        if cached is not None and cached[0] == epoch and cached[1] == count:
            reducer = cached[2]
            _core(reducer.add, record)
            self._remember(join_id, epoch, count + 1, reducer)
            records: list[R.Record] | None = None
        else:
            records = list(msgs.read())
            reducer = self._rebuild(join_id, epoch, count + 1, records)
        if record[R.TIME] <= horizon or (_core(reducer.closable) and self._decide_now(
                reducer, record, horizon, wake)):
            # _settle writes META (or clears the state) on every path
            yield from self._settle(join_id, records or list(msgs.read()),
                                    [epoch, count + 1, horizon, wake, None, None, size], msgs,
                                    meta, decide_timer, expire_timer)
            return
        deadline = _core(reducer.deadline)
        if deadline is None:
            raise ValueError("a join with records has a deadline")
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
            yield from self._settle(key, list(msgs.read()), value, msgs, meta, decide_timer,
                                    expire_timer)
        except _JoinFailed as failed:
            yield from self._poisoned(key, [], failed, msgs, meta, decide_timer, expire_timer)

    @userstate.on_timer(EXPIRE)
    def on_expire(self, key: Any = beam.DoFn.KeyParam,
                  msgs: Any = beam.DoFn.StateParam(MSGS),
                  meta: Any = beam.DoFn.StateParam(META),
                  decide_timer: Any = beam.DoFn.TimerParam(DECIDE),
                  expire_timer: Any = beam.DoFn.TimerParam(EXPIRE)) -> Iterator[Any]:
        """The tombstone's retention ended: drop it. Records after its end that arrived
        meanwhile start the next join (decided as any join, ``_settle``); with none, all of
        the join's state and timers are dropped."""
        self._cache.pop(key, None)
        value = _read_meta(meta)
        records = list(msgs.read())
        if value is None or not records:
            self._clear(msgs, meta, decide_timer, expire_timer)
            return
        expiry = value[TOMB][3] if value[TOMB] is not None else value[HORIZON]
        fresh = [random.getrandbits(62), len(records), max(value[HORIZON], expiry), None, None,
                 None, value[BYTES]]
        try:
            yield from self._settle(key, records, fresh, msgs, meta, decide_timer, expire_timer)
        except _JoinFailed as failed:
            yield from self._poisoned(key, [], failed, msgs, meta, decide_timer, expire_timer)


class JoinRecords(beam.PTransform):
    """Keyed input -> ``closes`` (main), ``late``, ``dead_letter`` outputs.

    Streaming: ``(join_id, record)`` (``ParseMessages``). Bounded: ``(join_id, (data,
    source))`` (``KeyMessages``), parsed after the shuffle with ``max_message_bytes``.
    """

    def __init__(self, catalog: Catalog, streaming: bool, max_messages_per_join: int = 100_000,
                 max_bytes_per_join: int = DEFAULT_MAX_BYTES_PER_JOIN, log_closes: bool = False,
                 max_message_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__()
        if max_messages_per_join < 1 or max_bytes_per_join < 1 or max_message_bytes < 1:
            raise ValueError("max_messages_per_join, max_bytes_per_join and max_message_bytes "
                             "must be >= 1")
        self._catalog = catalog
        self._streaming = streaming
        self._max_messages = max_messages_per_join
        self._max_bytes = max_bytes_per_join
        self._max_message_bytes = max_message_bytes
        self._log_closes = log_closes

    def expand(self, keyed: beam.PCollection) -> pvalue.DoOutputsTuple:
        if self._streaming:
            return keyed | "StatefulJoin" >> beam.ParDo(
                JoinDoFn(self._catalog, self._max_messages, max_bytes=self._max_bytes,
                         log_closes=self._log_closes)).with_input_types(
                    tuple[str, tuple]).with_outputs(
                    LATE, DEAD_LETTER, main=CLOSES)
        return (
            keyed
            | "GroupByJoin" >> beam.GroupByKey()
            | "Close" >> beam.ParDo(_CloseGroups(
                self._catalog, self._max_messages, self._max_bytes, self._log_closes,
                self._max_message_bytes)).with_outputs(LATE, DEAD_LETTER, main=CLOSES)
        )
