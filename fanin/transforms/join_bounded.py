"""The bounded plan's close step (``fanin.transforms.join``): one join's grouped messages ->
its closes, late lines and dead letters."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.metrics.metric import Metrics

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog
from fanin.contracts.parsing import DEFAULT_MAX_BYTES, dead_letter, parse_message
from fanin.core.bounded import bounded_outputs
from fanin.core.outcomes import DEAD_LETTER
from fanin.transforms.join_outputs import (
    _INTERNAL,
    DEFAULT_MAX_BYTES_PER_JOIN,
    _Counting,
    _internal_errors,
)
from fanin.transforms.parse import PackedMessages

__all__ = ["CloseGroups"]


class CloseGroups(_Counting):
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
                 max_message_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._catalog = catalog
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

    def process(self, element: tuple[str, Iterable[bytes]]) -> Iterator[Any]:
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
                                              self._max_bytes, on_error=_internal_errors))
