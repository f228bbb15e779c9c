"""The bounded plan's close step (``fanin.transforms.join``): one join's grouped messages ->
its closes, late lines and dead letters."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics.metric import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog
from fanin.contracts.parsing import DEFAULT_MAX_BYTES, dead_letter, parse_message
from fanin.core.bounded import bounded_outputs
from fanin.core.outcomes import DEAD_LETTER, Output
from fanin.transforms.forked_helpers import HelpedStep, Helpers
from fanin.transforms.join_outputs import (
    _INTERNAL,
    DEFAULT_MAX_BYTES_PER_JOIN,
    _Counting,
    _internal_errors,
)
from fanin.transforms.parse import PackedMessages

__all__ = ["CloseGroups"]


class CloseGroups(HelpedStep, _Counting):
    """The bounded plan's close step: one join's grouped messages -> its outputs.

    The messages arrive raw, packed with their sources (one or more per grouped value) and
    keyed by ``KeyMessages`` (``fanin.transforms.parse``); each is unpacked and parsed here
    (``parse_message``): its record joins, or its dead letter is emitted. A record whose
    join_id is not the group's key (which ``read_join_id`` rules out) is an
    ``internal_error`` dead letter, never folded into another join.

    Memory: a join within ``max_messages`` is parsed once and decided from a list of its
    records. A hot join (more messages than that) keeps no list: ``bounded_outputs`` reads its
    grouped messages again (parsed again, twice per decision) and holds only the first
    ``max_messages`` records; every output is emitted as it is made. Dead letters of the
    parse are emitted as they come.

    Poison-proof: an exception the core raises while deciding makes the records it had not
    put in an output yet ``internal_error`` dead letters (``bounded_outputs``' ``on_error``);
    outputs already emitted stand, so every record is in exactly one output.

    Helpers (``processes`` > 1; ``fanin.pipelines.runner_choice.close_processes`` asks for
    them on Beam's in-process runner only): ``processes - 1`` processes forked from this one
    (``fanin.transforms.forked_helpers``) decide batches of ``_BATCH_JOINS`` joins while this
    one decides the joins that come while every helper is busy. Each join is decided exactly
    once, by the same code here or in a helper, so the outputs are the ones a single process
    gives (in another order within the bundle: the files sort their lines); a batch whose
    helper fails is decided here (the helper's failure is logged, a warning). A batch's
    outputs are emitted at its joins' timestamps, windows and panes, all of them by the end
    of the bundle, where the helpers end (their memory and descriptors with them). No helper
    is forked for a bundle of fewer than ``_BATCH_JOINS`` joins.
    """

    class _Reparsed:
        """A hot join's records, parsed again from the grouped messages on each iteration
        (the records only: their dead letters were emitted by the first reading)."""

        def __init__(self, close: CloseGroups, join_id: str, grouped: Iterable[bytes]) -> None:
            self._close, self._join_id, self._grouped = close, join_id, grouped

        def __iter__(self) -> Iterator[R.Record]:
            for record, _ in self._close._parse(self._join_id, self._grouped):
                if record is not None:
                    yield record

    def __init__(self, catalog: Catalog, max_messages: int,
                 max_bytes: int = DEFAULT_MAX_BYTES_PER_JOIN, log_closes: bool = False,
                 max_message_bytes: int = DEFAULT_MAX_BYTES, processes: int = 1) -> None:
        self._with_helpers(processes)
        self._catalog = catalog
        # the batch being made for a helper: its joins, and each one's timestamp, window and
        # pane (its outputs' when emitted later), and its messages' bytes
        self._batch: list[tuple[str, list[bytes]]] = []
        self._where: list[WindowedValue] = []
        self._batch_bytes = 0
        self._contracts = frozenset(catalog.contracts)
        self._max_messages = max_messages
        self._max_bytes = max_bytes
        self._max_message_bytes = max_message_bytes
        self._log_closes = log_closes
        self._parsed = Metrics.counter("fanin", "messages.parsed")
        self._packing = PackedMessages()

    # A join's messages after its first _MEMO_AFTER are parsed through a memo of up to
    # _MEMO_SIZE texts: a hot join is mostly an agent repeating itself, and parse_message
    # depends on the source only in the record's SOURCE field
    _MEMO_AFTER, _MEMO_SIZE = 1_000, 4_096

    def _parse(self, join_id: str, grouped: Iterable[bytes]
               ) -> Iterator[tuple[R.Record | None, tuple[str, dict[str, Any]] | None]]:
        """Per grouped (packed) message: ``(its record, None)`` or ``(None, its dead
        letter)``."""
        contracts, limit, unpack = self._contracts, self._max_message_bytes, self._packing.unpack
        memo: dict[bytes, R.Record] = {}
        messages = (message for packed in grouped for message in unpack(packed))
        for n, (data, source) in enumerate(messages):
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

    def process(self, element: tuple[str, Iterable[bytes]],
                where: Any = beam.DoFn.WindowedValueParam) -> Iterator[Any]:
        """The per-join limit (docs/spec.md §4): a join holds its first ``max_messages``
        records in arrival order (bounded input: event time, opens first, then the text), and
        no more than ``max_bytes`` of messages (the first record that does not fit ends it).
        A record beyond it is late if the join closed before its event time, starts the next
        join if an undefined join was decided before it, else it is ``join_too_large``. A
        record after a closed join's tombstone (``D + retention_s``) starts the next join, as
        in a stream whose watermark passed the tombstone's end before it arrived.

        With helpers, a join of at most ``_SENT_VALUES`` grouped values and ``_SENT_BYTES``
        bytes may go into the batch the next idle helper decides; the others are decided here,
        as they come."""
        join_id, grouped = element
        helpers = self._helpers
        if helpers is not None:
            yield from self._helped(helpers.finished())
            if self._full() and helpers.idle():
                self._send(helpers)
            if not self._full():
                values = list(islice(grouped, self._SENT_VALUES + 1))
                size = sum(map(len, values))
                if len(values) <= self._SENT_VALUES and size <= self._SENT_BYTES:
                    self._batch.append((join_id, values))
                    self._where.append(where.with_value(None))  # not its messages
                    self._batch_bytes += size
                    return
        yield from self._emit(self._outputs(join_id, grouped))

    def _full(self) -> bool:
        return len(self._batch) >= self._BATCH_JOINS or self._batch_bytes >= self._BATCH_BYTES

    def _outputs(self, join_id: str, grouped: Iterable[bytes]) -> Iterator[Output]:
        """One join's outputs: its parse's dead letters as they come, then its decision's;
        its records are counted (``messages.parsed``)."""
        records: list[R.Record] | None = []
        parsed = 0
        for record, letter in self._parse(join_id, grouped):
            if letter is not None:
                yield letter
            elif record is not None:
                parsed += 1
                if records is not None:
                    records.append(record)
                    if parsed > self._max_messages:
                        records = None  # a hot join: read again, never held whole
        self._parsed_here += parsed
        group = self._Reparsed(self, join_id, grouped) if records is None else records
        yield from bounded_outputs(group, self._catalog, self._max_messages, self._max_bytes,
                                   on_error=_internal_errors)

    # Helpers (``processes`` > 1): joins go to them in batches of _BATCH_JOINS (~20 ms of
    # work each on the fleet headline's joins) or _BATCH_BYTES of messages, whichever comes
    # first (each batch is copied twice on its way), a join with at most _SENT_VALUES grouped
    # values (each one message or more) and _SENT_BYTES
    _BATCH_JOINS, _SENT_VALUES = 128, 256
    _BATCH_BYTES, _SENT_BYTES = 16 << 20, 1 << 20
    _step, _itself = "close step", "decides its joins itself"

    def _helper_work(self, batch: list[tuple[str, list[bytes]]]
                     ) -> tuple[list[list[Output]], int]:
        return self._decided(batch)

    def start_bundle(self) -> None:
        super().start_bundle()
        self._take_batch()
        self._parsed_here = 0
        self._end_unfinished()

    def finish_bundle(self) -> Iterator[Any]:
        """The batches held are decided (the last one partly here) and emitted; then the
        bundle's counts go to the counters."""
        helpers = self._helpers
        if helpers is not None:
            yield from self._helped(helpers.finished())
            batch, where = self._take_batch()
            if len(batch) > 1 and helpers.forked and helpers.idle():
                half = len(batch) // 2
                helpers.submit(batch[:half], where[:half])
                batch, where = batch[half:], where[half:]
            yield from self._here(batch, where)
            yield from self._helped(helpers.finished(wait=True))
            self._end_helpers()  # before the writes' finalize: their memory and descriptors
        self._parsed.inc(self._parsed_here)
        super().finish_bundle()

    def _send(self, helpers: Helpers[list[tuple[str, list[bytes]]], Any]) -> None:
        helpers.submit(*self._take_batch())

    def _take_batch(self) -> tuple[list[tuple[str, list[bytes]]], list[WindowedValue]]:
        """The batch being made (its joins, and where each one's outputs go) and an empty one
        in its place."""
        taken = self._batch, self._where
        self._batch, self._where, self._batch_bytes = [], [], 0
        return taken

    def _decided(self, batch: list[tuple[str, list[bytes]]]) -> tuple[list[list[Output]], int]:
        """What a helper does with a batch: each join's outputs, and the records parsed."""
        self._parsed_here = 0
        outputs = [list(self._outputs(join_id, grouped)) for join_id, grouped in batch]
        return outputs, self._parsed_here

    def _helped(self, done: list[tuple[Any, list[tuple[str, list[bytes]]], Any]]
                ) -> Iterator[Any]:
        """The outputs of batches the helpers answered (decided here if a helper failed, which
        is logged), each at its join's timestamp, window and pane."""
        self._report_failures()
        for where, batch, result in done:
            if result is None:
                yield from self._here(batch, where)
                continue
            outputs, parsed = result
            self._parsed_here += parsed
            for place, joins in zip(where, outputs, strict=True):
                yield from self._emitted_at(joins, place)

    def _here(self, batch: list[tuple[str, list[bytes]]], where: list[WindowedValue]
              ) -> Iterator[Any]:
        """A batch decided here, each join's outputs at its timestamp, window and pane."""
        for (join_id, grouped), place in zip(batch, where, strict=True):
            yield from self._emitted_at(self._outputs(join_id, grouped), place)

    def _emitted_at(self, outputs: Iterable[Output], place: WindowedValue
                    ) -> Iterator[Any]:
        """``outputs`` emitted (``_emit``) outside their join's ``process`` call, at its
        timestamp, window and pane (``place``)."""
        for item in self._emit(outputs):
            yield _placed(item, place)


def _placed(item: Any, place: WindowedValue) -> Any:
    """An output emitted outside its join's ``process`` call, at that join's timestamp,
    windows and pane (``place``: the join's windowed value)."""
    if isinstance(item, pvalue.TaggedOutput):
        return pvalue.TaggedOutput(item.tag,
                                   place.with_value(item.value))
    return place.with_value(item)
