"""Beam composites: raw messages -> keyed records (``ParseMessages``) or keyed messages
(``KeyMessages``), with a dead-letter output.

Guarantees:
- ``ParseMessages``: every input element ``(data, source)`` leaves as exactly one element:
  either ``(join_id, record)`` on the main output or one dead-letter dict on ``DEAD_LETTER``
  (``ParseFn``; a replay's stream parses its lines with it as it reads them,
  ``fanin.transforms.replay``).
- ``KeyMessages`` (the bounded plan, global window): every input element ``(line bytes,
  (path, line number))`` (``ReadNumberedLines``) leaves exactly once: packed with its source
  (``PackedMessages``, which gives both back exactly) into a ``(join_id, packed messages)``
  value of the main output, keyed by its join_id (``read_join_id``, or the record's when only
  a full parse can tell), or as one dead-letter dict. The messages of one join held together
  (up to 10,000 messages or 32 MiB per step, and to the end of a bundle) share a value, so
  the shuffle moves a value per join and hold, not per message (a hot join's: per message).
  The full parse of a keyed message happens after the shuffle, in the bounded join
  (``fanin.transforms.join``): a raw message is ~5x cheaper to shuffle than its record.
- Nothing is logged per element; dead letters are counted by error in Beam metrics
  (namespace ``fanin``, ``dead_letter.<error>``) and valid messages in ``messages.parsed``.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import PCollection
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue

from fanin.contracts import records as R
from fanin.contracts.parsing import DEFAULT_MAX_BYTES, parse_message, read_join_id
from fanin.core.outcomes import DEAD_LETTER

__all__ = ["DEAD_LETTER", "RECORDS", "RECORD_TYPE", "KeyMessages", "PackedMessages", "ParseFn",
           "ParseMessages"]

# ``(join_id, record)``: the main output of ``ParseMessages`` (Beam infers its coder from it),
# tagged ``RECORDS`` (``parsed.records``)
RECORD_TYPE = tuple[str, tuple[Any, ...]]
RECORDS = "records"

_LOG = logging.getLogger(__name__)
_PROGRESS_EVERY = 100_000


def _dead_letter(dead: dict[str, Any] | None) -> pvalue.TaggedOutput[str, dict[str, Any]]:
    """``parse_message``'s dead letter, counted, as the tagged output."""
    if dead is None:
        raise ValueError("parse_message returns a record or a dead letter")
    Metrics.counter("fanin", f"dead_letter.{dead['error']}").inc()
    return pvalue.TaggedOutput(DEAD_LETTER, dead)


class _Reading(beam.DoFn):
    """Reads messages with ``parse_message``'s settings; logs progress every 100,000."""

    def __init__(self, contract_names: frozenset[str], max_bytes: int) -> None:
        self._contracts = contract_names
        self._max_bytes = max_bytes
        self._seen = 0

    def _note_read(self) -> None:
        self._seen += 1
        if self._seen % _PROGRESS_EVERY == 0:
            _LOG.info("fanin: %d messages read by this worker", self._seen)


class ParseFn(_Reading):
    """``(data, source)`` -> ``(join_id, record)`` or a tagged dead letter (``parsed``)."""

    def __init__(self, contract_names: frozenset[str], max_bytes: int) -> None:
        super().__init__(contract_names, max_bytes)
        self._parsed = Metrics.counter("fanin", "messages.parsed")
        self._bundle_parsed = 0

    def parsed(self, data: bytes | str, source: Any) -> Any:
        """One message's element: ``(join_id, record)``, or its dead letter tagged
        ``DEAD_LETTER``; counted either way (for another DoFn that reads messages itself:
        ``fanin.transforms.replay``)."""
        return self.counted(*parse_message(data, source, self._contracts, self._max_bytes))

    def counted(self, record: R.Record | None, dead: dict[str, Any] | None) -> Any:
        """``parse_message``'s result ``(record, dead letter)`` as ``parsed`` makes it an
        element, counted (for a result parsed earlier: ``fanin.transforms.replay``)."""
        self._note_read()
        if record is not None:
            self._bundle_parsed += 1
            return record[R.JOIN_ID], record
        return _dead_letter(dead)

    def process(self, element: tuple[bytes | str, Any]) -> Iterator[Any]:
        yield self.parsed(*element)

    def start_bundle(self) -> None:
        self._bundle_parsed = 0

    def finish_bundle(self) -> None:
        self._parsed.inc(self._bundle_parsed)  # one metric update per bundle


# A packed message: its line number, the sizes of the path's bytes and of the message, the
# path, the message; a packed value is one or more packed messages back to back
_HEAD = struct.Struct("<QIQ")


class PackedMessages:
    """File lines' messages and sources ``(data, (path, line))`` as one bytes value, and back.

    The bounded plan shuffles every message, and FnApiRunner holds a join's messages decoded
    (before the shuffle, and as one list after it): bytes are ~180 B less per message than
    ``(data, (path, line))``'s two tuples, bytes, string and int, and the ``BytesCoder`` they
    take through the shuffle is ~6x cheaper than ``FastPrimitivesCoder`` on that tuple.
    ``pack`` makes one message's value; values joined back to back (``b"".join``) are one
    value of all their messages. ``list(unpack(b"".join(pack(*m) for m in messages))) ==
    messages`` for any bytes ``data``, path (also with surrogate escapes) and line number in
    0..2**64-1; every message of one path unpacked by one instance shares one path string.
    """

    def __init__(self) -> None:
        self._names: dict[str, bytes] = {}
        self._paths: dict[bytes, str] = {}

    def pack(self, data: bytes, source: tuple[str, int]) -> bytes:
        path, line = source
        name = self._names.get(path)
        if name is None:
            name = self._names[path] = path.encode("utf-8", "surrogateescape")
        return _HEAD.pack(line, len(name), len(data)) + name + data

    def unpack(self, packed: bytes) -> Iterator[tuple[bytes, tuple[str, int]]]:
        """Every message of a packed value, in the order it was packed."""
        head, paths, offset, end = _HEAD.size, self._paths, 0, len(packed)
        while offset < end:
            line, size, length = _HEAD.unpack_from(packed, offset)
            start = offset + head
            offset = start + size
            name = packed[start:offset]
            path = paths.get(name)
            if path is None:
                path = paths[name] = name.decode("utf-8", "surrogateescape")
            start, offset = offset, offset + length
            yield packed[start:offset], (path, line)


class _KeyFn(_Reading):
    """``(data, (path, line))`` -> ``(join_id, packed messages)`` or a tagged dead letter.

    Parses in full only a message whose join_id ``read_join_id`` cannot tell. The messages
    of a join held together leave as one packed value (``PackedMessages``), so the shuffle and
    the runner's per-element work run per join and hold, not per message: fleet files keep a
    join's messages close together (200,049 messages of 29,000 joins leave as 32,238 values).
    When ``_HOLD_MESSAGES`` messages or ``_HOLD_BYTES`` bytes are held, all are emitted; the
    rest at the bundle's end. A join that reaches ``_JOIN_MESSAGES`` held messages is hot:
    they leave as a value each, as without holding (large packed values of one hot join
    raised the 1M-message hot join's peak memory by up to 200 MB in the local runner).
    Input is in the global window (a bounded read): values emitted at a bundle's end are in
    it too."""

    _HOLD_MESSAGES, _HOLD_BYTES, _JOIN_MESSAGES = 10_000, 32 << 20, 256

    def __init__(self, contract_names: frozenset[str], max_bytes: int) -> None:
        super().__init__(contract_names, max_bytes)
        self._packing = PackedMessages()
        self._held: dict[str, list[bytes]] = {}
        self._held_messages = self._held_bytes = 0

    def process(self, element: tuple[bytes, tuple[str, int]]) -> Iterator[Any]:
        data, source = element
        self._note_read()
        join_id = read_join_id(data, self._max_bytes)
        if join_id is None:
            record, dead = parse_message(data, source, self._contracts, self._max_bytes)
            if record is None:
                yield _dead_letter(dead)
                return
            join_id = record[R.JOIN_ID]
        packed = self._packing.pack(data, source)
        held = self._held.get(join_id)
        if held is None:
            held = self._held[join_id] = [packed]
        else:
            held.append(packed)
        self._held_messages += 1
        self._held_bytes += len(packed)
        if len(held) >= self._JOIN_MESSAGES:  # a hot join: a value per message, as unheld
            del self._held[join_id]
            self._held_messages -= len(held)
            self._held_bytes -= sum(map(len, held))
            for one in held:
                yield join_id, one
        elif self._held_messages >= self._HOLD_MESSAGES or \
                self._held_bytes >= self._HOLD_BYTES:
            yield from self._release()

    def _release(self) -> Iterator[tuple[str, bytes]]:
        """Every held join's messages as one packed value; holds nothing after."""
        held, self._held = self._held, {}
        self._held_messages = self._held_bytes = 0
        for join_id, packed in held.items():
            yield join_id, packed[0] if len(packed) == 1 else b"".join(packed)

    def start_bundle(self) -> None:
        self._held = {}
        self._held_messages = self._held_bytes = 0

    def finish_bundle(self) -> Iterator[WindowedValue]:
        for keyed in self._release():
            yield GlobalWindows.windowed_value(keyed)


class ParseMessages(beam.PTransform[PCollection[Any], pvalue.DoOutputsTuple]):
    """``(data, source)`` -> main ``(join_id, record)`` + tagged ``dead_letter`` dicts."""

    # the step's label, its DoFn, and its main output's type (which gives the coder)
    _step: str = "Validate"
    _fn: type[_Reading] = ParseFn
    _keyed: Any = RECORD_TYPE

    def __init__(self, contract_names: frozenset[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__()
        if max_bytes <= 0:
            raise ValueError("max_bytes must be > 0")
        self._contracts = frozenset(contract_names)
        self._max_bytes = max_bytes

    def expand(self, pcoll: PCollection[Any]) -> pvalue.DoOutputsTuple:
        return pcoll | self._step >> beam.ParDo(
            self._fn(self._contracts, self._max_bytes)
        ).with_output_types(self._keyed).with_outputs(DEAD_LETTER, main=RECORDS)


class KeyMessages(ParseMessages):
    """``(data, (path, line))`` -> main ``(join_id, packed messages)`` (``PackedMessages``) +
    tagged ``dead_letter`` dicts: the bounded plan's first half of ``ParseMessages`` (see the
    module docstring)."""

    _step, _fn, _keyed = "Key", _KeyFn, tuple[str, bytes]
