"""Beam composites: raw messages -> keyed records (``ParseMessages``) or keyed messages
(``KeyMessages``), with a dead-letter output.

Guarantees:
- ``ParseMessages``: every input element ``(data, source)`` leaves as exactly one element:
  either ``(join_id, record)`` on the main output or one dead-letter dict on ``DEAD_LETTER``
  (``ParseFn``; a replay's stream parses its lines with it as it reads them,
  ``fanin.transforms.replay``).
- ``KeyMessages`` (the bounded plan, global window): every message ``(line bytes, (path,
  line number))`` of an input chunk (``ReadNumberedLines``: up to 10,000 messages or 32 MiB)
  leaves exactly once: packed with its source (``PackedMessages``, which gives both back
  exactly) into a ``(join_id, packed messages)`` value of the main output, keyed by its
  join_id (``read_join_id``, or the record's when only a full parse can tell), or as one
  dead-letter dict. The messages of one join in a chunk share a value, so the shuffle moves
  a value per join and chunk, not per message (a hot join's: per message); chunks leave in
  the order they came, whichever process keyed them (``_KeyFn``).
  The full parse of a keyed message happens after the shuffle, in the bounded join
  (``fanin.transforms.join``): a raw message is ~5x cheaper to shuffle than its record.
- Nothing is logged per element; dead letters are counted by error in Beam metrics
  (namespace ``fanin``, ``dead_letter.<error>``) and valid messages in ``messages.parsed``.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from collections.abc import Iterator
from typing import Any, cast

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import PCollection
from apache_beam.transforms.window import GlobalWindows

from fanin.contracts import records as R
from fanin.contracts.parsing import DEFAULT_MAX_BYTES, parse_message, read_join_id
from fanin.core.outcomes import DEAD_LETTER
from fanin.transforms.forked_helpers import HelpedStep
from fanin.transforms.read import Message, for_helpers

__all__ = ["DEAD_LETTER", "RECORDS", "RECORD_TYPE", "KeyMessages", "PackedMessages", "ParseFn",
           "ParseMessages"]

# ``(join_id, record)``: the main output of ``ParseMessages`` (Beam infers its coder from it),
# tagged ``RECORDS`` (``parsed.records``)
RECORD_TYPE = tuple[str, tuple[Any, ...]]
RECORDS = "records"

_LOG = logging.getLogger(__name__)
# a chunk of messages keyed: its values ``(join_id, packed messages)`` and its dead letters
# (``_KeyFn.keyed_chunk``)
Keyed = tuple[list[tuple[str, bytes]], list[dict[str, Any] | None]]
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

    def _note_read(self, messages: int = 1) -> None:
        before, self._seen = self._seen, self._seen + messages
        if self._seen // _PROGRESS_EVERY > before // _PROGRESS_EVERY:
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


class _KeyFn(HelpedStep, _Reading):
    """A chunk of messages ``[(data, (path, line)), ...]`` (``ReadNumberedLines``) ->
    ``(join_id, packed messages)`` values and tagged dead letters.

    Each chunk is keyed as a whole (``keyed_chunk``): each message by ``read_join_id``,
    parsed in full only when that cannot tell. A chunk's messages of one join leave as one
    packed value (``PackedMessages``), so the shuffle and the runner's per-element work run
    per join and chunk, not per message: fleet files keep a join's messages close together
    (200,049 messages of 29,000 joins leave as ~32,000 values). A join that reaches
    ``_JOIN_MESSAGES`` messages in a chunk is hot: its messages leave as a value each (large
    packed values of one hot join raised the 1M-message hot join's peak memory by up to 200
    MB in the local runner).

    Helpers (``processes`` > 1: ``fanin.pipelines.runner_choice.close_processes`` asks for
    them on Beam's in-process runner only): ``processes - 1`` processes forked from this one
    (``fanin.transforms.forked_helpers``) key full chunks while this one reads the next; a
    chunk that comes while every helper is busy, a file's last (partial) chunk, and a chunk
    holding a line longer than ``max_bytes`` (``for_helpers``) are keyed here, so an input
    of one chunk forks nothing. Chunks leave in the order they came, whoever
    keyed them, so a join's messages reach the shuffle in the order they were read and the
    values are the ones one process makes; a chunk whose helper fails is keyed here (logged,
    a warning). The helpers end with the bundle. Input is in the global window (a bounded
    read): values emitted at a bundle's end are in it too."""

    _JOIN_MESSAGES = 256
    _step, _itself = "key step", "keys its messages itself"

    def __init__(self, contract_names: frozenset[str], max_bytes: int,
                 processes: int = 1) -> None:
        super().__init__(contract_names, max_bytes)
        self._with_helpers(processes)
        self._packing = PackedMessages()
        self._start()

    def _start(self) -> None:
        """No chunk held: the chunks that came, in order, each with its keyed result once
        known (a helper's: None until it answers), up to the first not emitted."""
        self._chunks: deque[list[Keyed | None]] = deque()

    def _helper_work(self, batch: list[Message]) -> Keyed:
        return self.keyed_chunk(batch)

    def process(self, chunk: list[Message]) -> Iterator[Any]:
        self._note_read(len(chunk))
        self._answered(wait=len(self._chunks) > 2 * self._processes)
        slot: list[Keyed | None] = [None]
        self._chunks.append(slot)
        helpers = self._helpers
        if helpers is not None and helpers.idle() and for_helpers(chunk):
            helpers.submit(chunk, slot)
        else:
            slot[0] = self.keyed_chunk(chunk)
        yield from self._keyed()

    def start_bundle(self) -> None:
        self._start()
        self._end_unfinished()

    def finish_bundle(self) -> Iterator[Any]:
        self._answered(wait=True)
        for out in self._keyed():
            yield _in_global(out)
        self._end_helpers()

    def keyed_chunk(self, chunk: list[Message]) -> Keyed:
        """A chunk's messages keyed, in read order: ``(values, dead letters)``, a join's
        messages packed into one value (a hot join's: a value each), each join's values in the
        order of its messages."""
        contracts, limit, pack = self._contracts, self._max_bytes, self._packing.pack
        values: list[tuple[str, bytes]] = []
        dead: list[dict[str, Any] | None] = []
        held: dict[str, list[bytes] | None] = {}  # None: a hot join, its values already out
        hot = self._JOIN_MESSAGES
        for data, source in chunk:
            join_id = read_join_id(data, limit)
            if join_id is None:
                record, letter = parse_message(data, source, contracts, limit)
                if record is None:
                    dead.append(letter)
                    continue
                join_id = record[R.JOIN_ID]
            packed = pack(data, source)
            if join_id not in held:
                held[join_id] = [packed]
                continue
            same = held[join_id]
            if same is None:
                values.append((join_id, packed))
                continue
            same.append(packed)
            if len(same) >= hot:
                values.extend((join_id, one) for one in same)
                held[join_id] = None
        values.extend((join_id, same[0] if len(same) == 1 else b"".join(same))
                      for join_id, same in held.items() if same is not None)
        return values, dead

    def _answered(self, wait: bool) -> None:
        """The helpers' chunks keyed so far (``wait``: all of them) take their results (a
        failed helper's chunk is keyed here)."""
        helpers = self._helpers
        if helpers is None:
            return
        for slot, chunk, result in helpers.finished(wait):
            slot[0] = self.keyed_chunk(chunk) if result is None else result
        self._report_failures()

    def _keyed(self) -> Iterator[Any]:
        """The chunks keyed, up to the first one not keyed yet, as elements, in read
        order."""
        chunks = self._chunks
        while chunks and chunks[0][0] is not None:
            values, dead = cast(Keyed, chunks.popleft()[0])
            for letter in dead:
                yield _dead_letter(letter)
            yield from values


def _in_global(out: Any) -> Any:
    """An element (or a tagged one) emitted at a bundle's end, in the global window."""
    if isinstance(out, pvalue.TaggedOutput):
        return pvalue.TaggedOutput(out.tag, GlobalWindows.windowed_value(out.value))
    return GlobalWindows.windowed_value(out)


class ParseMessages(beam.PTransform[PCollection[Any], pvalue.DoOutputsTuple]):
    """``(data, source)`` -> main ``(join_id, record)`` + tagged ``dead_letter`` dicts."""

    # the step's label, and its main output's type (which gives the coder)
    _step: str = "Validate"
    _keyed: Any = RECORD_TYPE

    def __init__(self, contract_names: frozenset[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__()
        if max_bytes <= 0:
            raise ValueError("max_bytes must be > 0")
        self._contracts = frozenset(contract_names)
        self._max_bytes = max_bytes

    def _dofn(self) -> _Reading:
        return ParseFn(self._contracts, self._max_bytes)

    def expand(self, pcoll: PCollection[Any]) -> pvalue.DoOutputsTuple:
        return pcoll | self._step >> beam.ParDo(self._dofn()).with_output_types(
            self._keyed).with_outputs(DEAD_LETTER, main=RECORDS)


class KeyMessages(ParseMessages):
    """``(data, (path, line))`` -> main ``(join_id, packed messages)`` (``PackedMessages``) +
    tagged ``dead_letter`` dicts: the bounded plan's first half of ``ParseMessages`` (see the
    module docstring); ``processes`` > 1 keys chunks in forked helpers too (``_KeyFn``)."""

    _step, _keyed = "Key", tuple[str, bytes]

    def __init__(self, contract_names: frozenset[str], max_bytes: int = DEFAULT_MAX_BYTES,
                 processes: int = 1) -> None:
        super().__init__(contract_names, max_bytes)
        if processes < 1:
            raise ValueError("processes must be >= 1")
        self._processes = processes

    def _dofn(self) -> _Reading:
        return _KeyFn(self._contracts, self._max_bytes, self._processes)
