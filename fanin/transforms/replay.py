"""Replay files as a deterministic stream on the local runner (``fanin run --replay``).

Guarantees:
- Lines are delivered in file order (file order = arrival order), each stamped with its event
  time (an open's ``opened_at``, a receipt's ``event_time``); a line the join does not take (a
  dead letter of the parse, ``MessageScan``: it has no event time, even one that can be read)
  is stamped with the current watermark, so it is never dropped as late by the source and
  moves no watermark: a refused message with a far-future time does not make the messages
  after it late.
  Several files are several sources of one stream (``by_event_time``): each keeps its own
  order, and they are merged by event time (the file whose next line is earliest goes
  first; ties by the order the files are given), so files each sorted by event time are
  replayed sorted, as one file would be.
- The watermark never passes ``max_seen - max_disorder_s`` (``max_seen``: the largest event
  time delivered so far) and only moves forward. Each line of a join sees the join's timers
  fired exactly as if the watermark stood at that bound when it arrived: before a line is
  delivered, the watermark moves up to the bound whenever a timer of its join may lie in
  between — the line is behind the bound (a decision timer may be due before its event
  time), or the join's tombstone may have expired (its lines' earliest time, ``opened_at``
  values included, plus the least ``retention_s`` in play). Other lines do not move it: a
  timer of another join cannot change what this line's join does. On input sorted by event
  time that leaves only a few advances (the outputs do not depend on them), where a step per
  second of event time made the local runner run a round of bundles for every transform per
  step (docs/performance.md). The watermark also moves up to the bound every ``batch`` lines
  when a deadline may have passed by then (a join's earliest time plus the least deadline in
  play, for the joins seen whose deadline it has not passed), which bounds the state of joins
  held open, and at the latest every ``4 * batch`` lines, which bounds the lines of one event
  (the local runner holds an event's records at once). Each move makes every join it holds
  that has a line in the next event pay the runner a state copy and a timer scan again, so
  joins that stay open across many events cost more per line. A line behind the watermark
  already there may set a timer that is due at once: the next line of its join comes in the
  stream's next event, which the local runner reads only once that timer has fired
  (``_Events.barrier``).
- Before the stream ends the watermark is advanced to ``end_ms``, past every decision timer
  the join can set (largest event time or ``opened_at`` + the largest deadline in play, and
  ``horizon_ms``), so every close and late line happens inside the stream (docs/beam-notes.md:
  output of timers fired only by the final jump to +infinity is lost on the
  BundleBasedDirectRunner). A tombstone that ends at or after ``end_ms`` is not expired
  inside the stream; no output depends on its expiry (no line comes after it), and the join
  is told ``end_ms`` so that it sets no timer for it (``JoinDoFn``'s ``input_end_ms``).
- The stream itself carries no line text: each of its elements is a run of consecutive lines
  of one file ``(path, (index of the first, event times))``, and the ``Parse`` step emits
  each line's element as ``ParseMessages`` does (``ParseFn``, with the settings of the plan's
  ``MessageScan``) with the line's event time: ``(join_id, record)`` on the main output
  ``records``, or its dead letter on ``DEAD_LETTER``. A worker in the process that built the
  job (the local runners', Prism's in its default ``LOOPBACK`` environment) takes the results
  of the plan's own parse of each line, kept encoded for it; a worker in another process
  (Flink's) reads the lines from the file (as a bounded run's read does) and parses them.
  Embedding every line in the TestStream made the job's construction cost grow with the input
  (the stream is pickled and compressed with the pipeline: 3.5 s for 20,811 lines), and the
  second parse ~0.4 s of a 19.7 s replay of 206,728 lines (docs/performance.md). A file changed
  between the launch and a worker's read fails the run with a clear error. Reading and
  parsing are one step because the local streaming runner does not fuse steps: every element
  a step emits is committed and handed to the next one, which cost ~11 % of a replay of
  206,728 lines (docs/performance.md).
- Split (``partitions`` > 1, ``fanin.pipelines.split_replay``): the plan is made once, from
  every line, and each partition gets a stream of its joins' lines (``partition_of``: by join
  id; the lines the join does not take in partition 0) with every watermark move and every
  break between events of the whole stream, so each join sees what it sees in the whole
  stream. ``part(i)`` replays partition ``i``, in the process that planned it or a fork of it
  (its worker takes the plan's parse; it reads no file).
- The stream uses a portable coder (``KV<string, KV<varint, bytes>>``): a Java runner
  (Flink) decodes the TestStream payload itself, so a Python-only (pickled) coder would fail
  there (docs/runners.md).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import json
import logging
import uuid
import weakref
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import orjson
from apache_beam import pvalue
from apache_beam.coders import (
    BytesCoder,
    FastPrimitivesCoder,
    StrUtf8Coder,
    TupleCoder,
    VarIntCoder,
)
from apache_beam.pvalue import PBegin, TaggedOutput
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import GlobalWindow, TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from fanin.contracts import records as R
from fanin.contracts.parsing import parse_message
from fanin.contracts.timefmt import MAX_MS, MIN_MS, duration_ms, parse_rfc3339
from fanin.core.outcomes import DEAD_LETTER
from fanin.transforms.forked_helpers import in_order
from fanin.transforms.parse import RECORD_TYPE, RECORDS, ParseFn
from fanin.transforms.read import Message, Source, chunked, for_helpers, numbered_lines

__all__ = ["MessageScan", "Replay", "Scan", "build_replay", "by_event_time", "covering_disorder_s",
           "partition_of", "scan_line"]


_LOG = logging.getLogger("fanin")


def _decode(line: bytes) -> Any:
    """``json.loads(line)``, by orjson where it can read the line (4-5x faster here). What
    orjson refuses (NaN, lone surrogates, not UTF-8, deep nesting) goes to ``json``; what it
    reads differently (an integer beyond 64 bits becomes a float) changes no value ``_scan``
    returns (such a deadline is beyond any timestamp either way, ``duration_ms``)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def _scan(line: bytes) -> tuple[int | None, int, str | None, int | None]:
    """Best-effort ``(event time ms, open's deadline ms or 0, join id, opened_at ms a receipt
    carries)`` of a raw line (``None`` for what cannot be read)."""
    try:
        obj = _decode(line)
        if not isinstance(obj, dict):
            return None, 0, None, None
        is_open = obj.get("kind") == "open"
        text = obj.get("opened_at") if is_open else obj.get("event_time")
        deadline = obj.get("deadline_s") if is_open else None
        extra = duration_ms(deadline) if isinstance(deadline, (int, float)) and \
            not isinstance(deadline, bool) and deadline > 0 else 0
        t = parse_rfc3339(text) if isinstance(text, str) else None
        join_id = obj.get("join_id")
        opened = obj.get("opened_at")
        carried = parse_rfc3339(opened) if not is_open and isinstance(opened, str) else None
        return t, extra, join_id if isinstance(join_id, str) else None, carried
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, 0, None, None


# a line -> (event time ms, open's deadline ms or 0, join id, opened_at ms a receipt carries)
Scan = Callable[[bytes], tuple[int | None, int, str | None, int | None]]


class MessageScan:
    """The scan of a replay's lines as the join reads them (``parse_message`` with the run's
    contract names and size limit, which the replay's stream parses its lines with): a line
    it refuses is ``(None, 0, None, None)``."""

    def __init__(self, contracts: Iterable[str], max_bytes: int) -> None:
        self.contracts = frozenset(contracts)
        self.max_bytes = max_bytes

    def __call__(self, line: bytes) -> tuple[int | None, int, str | None, int | None]:
        return self.parse(line, ("", 0))[0]

    def parse(self, line: bytes, source: Source
              ) -> tuple[tuple[int | None, int, str | None, int | None],
                         tuple[R.Record | None, dict[str, Any] | None]]:
        """``(the line's scan, parse_message's result for the line from source)``."""
        parsed = parse_message(line, source, self.contracts, self.max_bytes)
        record = parsed[0]
        if record is None:
            return (None, 0, None, None), parsed
        if record[R.KIND] == R.OPEN:
            return (record[R.TIME], record[R.O_DEADLINE_MS] or 0, record[R.JOIN_ID], None), parsed
        return (record[R.TIME], 0, record[R.JOIN_ID], record[R.R_OPENED_AT]), parsed


# a line's scan, and parse_message's result for it encoded (``_RESULT``)
_Scanned = tuple[tuple[int | None, int, str | None, int | None], bytes]


def _scan_chunk(scan: MessageScan, chunk: list[Message]) -> list[_Scanned]:
    """Each line of ``chunk`` scanned and parsed as the plan keeps it."""
    out: list[_Scanned] = []
    for line, source in chunk:
        scanned, result = scan.parse(line, source)
        out.append((scanned, _RESULT.encode(result)))
    return out


def _plan_failed(reason: str) -> None:
    _LOG.warning("fanin: a helper of the replay's plan failed (%s); the plan parses its "
                 "lines itself", reason)


def _scanned(lines: Iterable[Message], scan: MessageScan, processes: int
             ) -> Iterator[tuple[Source, _Scanned]]:
    """Each line's source and ``_scan_chunk`` result, in order; the lines parsed in chunks
    (``chunked``) with ``processes - 1`` helpers taking full ones (``in_order``,
    ``for_helpers``: a replay of fewer lines than a chunk forks nothing for its plan)."""
    for chunk, results in in_order(functools.partial(_scan_chunk, scan), chunked(lines),
                                   processes, for_helpers, _plan_failed):
        for (_, source), result in zip(chunk, results, strict=True):
            yield source, result


def covering_disorder_s(lines: Iterable[tuple[bytes, Source]], scan: Scan) -> float:
    """The least whole ``--max-disorder-s`` with which a replay of ``lines`` (in arrival
    order, as ``by_event_time`` gives several files) delivers no message behind its watermark:
    the largest lag of a line's event time (``scan``'s) behind the latest one before it."""
    latest: int | None = None
    worst = 0
    for line, _ in lines:
        t = scan(line)[0]
        if t is not None:
            latest = t if latest is None else max(latest, t)
            worst = max(worst, latest - t)
    return float(-(-worst // 1000))


def scan_line(line: bytes) -> tuple[int | None, int]:
    """Best-effort ``(event time ms or None, open's deadline ms or 0)`` of a raw line, also of
    one the parse refuses (to sort a file by event time); a replay scans with
    ``MessageScan``."""
    t, deadline, _, _ = _scan(line)
    return t, deadline


# (path, (index of the run's first line among the file's messages, event times as int64s))
RUN_CODER = TupleCoder([StrUtf8Coder(), TupleCoder([VarIntCoder(), BytesCoder()])])
RUN_TYPE = tuple[str, tuple[int, bytes]]


# A replay's elements are in the global window: its lines are given it as they are emitted,
# not assigned it one by one (a GlobalWindow() per line cost ~3 % of a replay)
_GLOBAL = (GlobalWindow(),)


def _lag_ms(max_disorder_s: float) -> int:
    """``max_disorder_s`` in whole ms, as every duration is counted (``duration_ms``: ``1.001``
    is 1,001 ms, where ``1.001 * 1000`` is 1,000.99...); beyond the span of timestamps
    (``MIN_MS`` to ``MAX_MS``) it is that span: every line is covered either way."""
    return min(duration_ms(max_disorder_s), MAX_MS - MIN_MS)


def _stamp(ms: int) -> Timestamp:
    return Timestamp(micros=ms * 1000)


def by_event_time(files: Sequence[Iterable[tuple[bytes, Source]]], scan: Scan
                  ) -> Iterator[tuple[bytes, Source]]:
    """The lines of several files (each ``(line, source)`` in its file's order) as one
    arrival order: merged by event time (``scan``'s), each file's own order kept. A line
    without one goes right after the line before it in its file (before any line, at the
    start); ties go to the file given first."""
    if len(files) == 1:
        yield from files[0]
        return
    _open_files_for(len(files))

    def keyed(lines: Iterable[tuple[bytes, Source]]) -> Iterator[tuple[int, tuple[bytes, Source]]]:
        key = -1 << 63
        for item in lines:
            t = scan(item[0])[0]
            key = key if t is None else t
            yield key, item

    for _, item in heapq.merge(*map(keyed, files), key=lambda pair: pair[0]):
        yield item


def _open_files_for(count: int) -> None:
    """Let this process hold ``count`` input files open at once, and some more: the soft
    limit is raised towards the hard one where it is lower (1,024 on many systems; the Go
    runtime does the same), else opening the files fails with one line naming one."""
    try:
        import resource
    except ImportError:  # not POSIX: no such limit to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):  # above what the system allows (macOS)
            resource.setrlimit(resource.RLIMIT_NOFILE, (
                wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard))


# token of the replay being read -> path -> its messages (one job's files at a time; a file
# leaves once its last run is read)
_READ: dict[str, dict[str, list[tuple[bytes, Source]]]] = {}

# token of a replay planned in this process -> path -> parse_message's result for each of its
# messages, as the plan parsed them, encoded (``_RESULT``: ~2 us to decode against ~7 us to
# parse; about twice the lines' text). A worker in this process (the local runners', Prism's
# LOOPBACK one) takes them from here; a file leaves once its last run is read, and the whole
# entry when the ``Replay`` is collected. A worker in another process reads and parses the
# file.
_PARSED: dict[str, dict[str, list[bytes]]] = {}
_RESULT = FastPrimitivesCoder().get_impl()


def _file_lines(path: str, token: str, max_bytes: int) -> list[tuple[bytes, Source]]:
    """The messages of ``path`` as read for the replay of job ``token``: read once per worker
    process while the replay moves through it, also when its runs alternate with other
    files' (several files merged by event time)."""
    files = _READ.get(token)
    if files is None:
        _READ.clear()  # another job's files are not read again
        files = _READ[token] = {}
    lines = files.get(path)
    if lines is None:
        lines = files[path] = list(numbered_lines(path, max_bytes))
    return lines


class _ParseRuns(beam.DoFn):
    """A run ``(path, (first, event times))`` -> each of its lines ``(line, (path, number))``
    parsed (``ParseFn.parsed``: ``(join_id, record)`` or a tagged dead letter), with the
    line's event time, in the global window (the stream's). ``planned_only``: the runs
    number the lines of one partition of a split replay, which only the plan's parse holds
    (kept to the job's end; the processes of a split replay are the planning process and its
    forks)."""

    def __init__(self, counts: dict[str, int], token: str, scan: MessageScan,
                 planned_only: bool = False) -> None:
        self._counts = counts
        self._token = token
        self._planned_only = planned_only
        self._parse = ParseFn(scan.contracts, scan.max_bytes)
        self._max_bytes = scan.max_bytes

    def start_bundle(self) -> None:
        self._parse.start_bundle()

    def finish_bundle(self) -> None:
        self._parse.finish_bundle()

    def process(self, run: tuple[str, tuple[int, bytes]]) -> Iterator[Any]:
        path, (first, packed) = run
        stamps = array("q")
        stamps.frombytes(packed)
        for parsed, ms in zip(self._elements(path, first, len(stamps)), stamps, strict=True):
            stamp = _stamp(ms)
            if isinstance(parsed, TaggedOutput):
                yield TaggedOutput(parsed.tag, WindowedValue(parsed.value, stamp, _GLOBAL))
            else:
                yield WindowedValue(parsed, stamp, _GLOBAL)
        if first + len(stamps) == self._counts[path] and not self._planned_only:
            # its last run: a retry reads the file
            _READ.get(self._token, {}).pop(path, None)
            _PARSED.get(self._token, {}).pop(path, None)

    def _elements(self, path: str, first: int, count: int) -> Iterator[Any]:
        """The elements of ``path``'s messages ``first`` to ``first + count - 1``: as the plan
        parsed them where it did so in this process, else read and parsed now."""
        planned = _PARSED.get(self._token, {}).get(path)
        if planned is not None:
            for index in range(first, first + count):
                yield self._parse.counted(*_RESULT.decode(planned[index]))
            return
        if self._planned_only:
            raise RuntimeError(f"--replay: the plan's parse of {path} is not in this process "
                               "(a partition of a split replay runs where it was planned)")
        lines = _file_lines(path, self._token, self._max_bytes)
        if len(lines) != self._counts[path]:
            raise RuntimeError(f"--replay: {path} changed while it was replayed "
                               f"({self._counts[path]} messages when the job was built, "
                               f"{len(lines)} now)")
        for index in range(first, first + count):
            yield self._parse.parsed(*lines[index])


class _Events:
    """The replay's ``TestStream`` as it is planned: events of lines, and watermark moves.

    ``advance(ms)`` delivers the pending lines as one event, then moves the watermark to
    ``ms``. ``barrier()`` delivers them as one event without moving it: the local runner reads
    a ``TestStream``'s next event only once every bundle in flight is done and no timer is due
    (``apache_beam.runners.direct.executor``, ``_add_work_if_necessary``), so a timer an
    earlier line set behind the watermark fires before the next event's lines arrive.
    ``due``: joins with a line delivered since the last event that may have set such a timer.
    """

    def __init__(self, batch: int, partitions: int = 1) -> None:
        self.streams = [TestStream(coder=RUN_CODER) for _ in range(partitions)]
        self.watermark: int | None = None  # milliseconds
        self.events = 0  # events planned (of lines, and watermark moves)
        self.since = 0  # lines since the watermark last moved
        self.due: set[str] = set()
        self._batch = batch
        # per partition: pending (path, first index, stamps)
        self._runs: list[list[tuple[str, int, array[int]]]] = [[] for _ in range(partitions)]

    def add(self, partition: int, path: str, index: int, stamp: int) -> None:
        """Line ``index`` of ``path`` (among the partition's) with event time ``stamp``,
        after the pending ones."""
        runs = self._runs[partition]
        if runs and runs[-1][0] == path and len(runs[-1][2]) < self._batch:
            runs[-1][2].append(stamp)
        else:
            runs.append((path, index, array("q", [stamp])))
        self.since += 1

    def barrier(self) -> None:
        """The pending lines, as one event of runs (in each partition that has some)."""
        if any(self._runs):
            for stream, runs in zip(self.streams, self._runs, strict=True):
                if runs:
                    stream.add_elements([
                        TimestampedValue((path, (first, stamps.tobytes())), _stamp(min(stamps)))
                        for path, first, stamps in runs])
                    runs.clear()
            self.events += 1
        self.due.clear()

    def advance(self, ms: int) -> None:
        self.barrier()
        for stream in self.streams:
            stream.advance_watermark_to(_stamp(ms))
        self.watermark, self.since = ms, 0
        self.events += 1


class _JoinsSeen:
    """The joins the plan has delivered lines of: each one's earliest time (of its lines'
    event times and ``opened_at`` values), and when the lines since the watermark last moved
    make it move: ``batch`` of them once a join's deadline may have passed (its earliest time
    plus the least deadline in play: a heap of those the watermark has not passed; with a
    floor of 0 any time may close a join), else ``4 * batch``."""

    def __init__(self, batch: int, floor_ms: int) -> None:
        self._batch = batch
        self._floor = floor_ms
        self._earliest: dict[str, int] = {}
        self._pending: list[int] = []

    def earliest(self, join_id: str | None) -> int | None:
        """The earliest time of the join's lines delivered so far (None: none yet)."""
        return None if join_id is None else self._earliest.get(join_id)

    def deadline(self, ms: int) -> None:
        """A line's own deadline (an open's ``deadline_s``; 0: none)."""
        if 0 < ms < self._floor:
            self._floor = ms

    def delivered(self, join_id: str, times: list[int]) -> None:
        """A line of ``join_id`` with these times (its event time, its ``opened_at``)."""
        first, known = min(times), self._earliest.get(join_id)
        if known is None or first < known:
            self._earliest[join_id] = first
            if self._floor:
                heapq.heappush(self._pending, first + self._floor)

    def due(self, since: int, bound: int) -> bool:
        """Whether the watermark moves up to ``bound`` after ``since`` lines."""
        if since < self._batch:
            return False
        return since >= 4 * self._batch or not self._floor or (
            bool(self._pending) and self._pending[0] <= bound)

    def passed(self, watermark: int) -> None:
        """The watermark moved to ``watermark``: the deadlines up to it are passed."""
        pending = self._pending
        while pending and pending[0] <= watermark:
            heapq.heappop(pending)


class Replay(beam.PTransform[PBegin, pvalue.DoOutputsTuple]):
    """Files replayed as a stream, parsed: ``ParseMessages``' outputs, the main one
    ``records`` of ``(join_id, record)``, dead letters on ``DEAD_LETTER`` (see the module's
    guarantees).

    ``lines``: ``(line, (path, number))`` in arrival order, as ``numbered_lines`` yields them
    (a worker in another process reads them again from ``path``); ``horizon_ms``: deadline room for
    the final advance (with retention as well, tombstones expire inside the stream);
    ``retention_floor_ms``: the least ``retention_s``
    any join can have, in ms (0 is always safe: the watermark then moves before every line of
    a join that has earlier lines and whose tombstone may have expired by the bound);
    ``scan``: each line's event time, deadline, join id and carried ``opened_at`` (a dead
    letter has none), and the settings the stream parses the lines with; ``batch``: the most
    lines between two advances while a deadline may pass (``deadline_floor_ms``), else ``4 *
    batch``. Each advance costs the local runner a round of bundles through every
    transform, and its monitor re-reads every key's timers between bundles; fewer advances
    hold more joins open. On 206,728 sorted lines 50,000 was
    the fastest measured: 61 s and 505 MB peak, against 74 s / 412 MB at 20,000 and 69 s /
    646 MB at 100,000 (whole processes, one each, load ~3).
    ``deadline_floor_ms``: the least ``deadline_s`` a join's definition can take from the
    contracts or the defaults, in ms; 0 (the watermark then moves every ``batch`` lines) when
    a join may close by a timer before its deadline (a ``watermark`` close trigger in play).
    Opens with a smaller ``deadline_s`` lower it as they come. It moves no output: on sorted
    input the outputs do not depend on these advances, and the lines whose outputs do (behind
    the bound, or after their join's tombstone may have ended) move the watermark whatever it
    says. ``partitions``: the joins split into so many streams (see the module's
    guarantees), each applied by ``part``; with more than one, the transform itself is not
    applied. ``processes``: the plan parses the lines in chunks, ``processes - 1`` helpers
    forked from this process taking some (``in_order``: the plan is the same; a helper that
    fails is logged and its chunk parsed here).
    """

    def __init__(self, lines: Iterable[tuple[bytes, Source]], max_disorder_s: float,
                 horizon_ms: int, scan: MessageScan, retention_floor_ms: int = 0,
                 batch: int = 50_000, deadline_floor_ms: int = 0, partitions: int = 1,
                 processes: int = 1) -> None:
        super().__init__()
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.partitions = partitions
        self._counts: list[dict[str, int]] = [{} for _ in range(partitions)]
        self._tokens = [uuid.uuid4().hex for _ in range(partitions)]
        # what the plan found, set by _plan
        self.behind = 0
        """Lines whose event time is behind the watermark when they arrive."""
        self.largest_lag_ms = 0
        """How far the latest event time before a line is ahead of it, at most (its disorder)."""
        self.events = 0
        """The stream's events before the jump to +infinity (each costs the local runner a
        round of bundles through every step, longer the more joins it holds; lines that lag
        more than ``max_disorder_s`` make an event each, nearly)."""
        self._scan = scan
        parsed: list[dict[str, list[bytes]]] = [{} for _ in range(partitions)]
        self._streams, self.end_ms = self._plan(_scanned(lines, scan, processes),
                                                _lag_ms(max_disorder_s), horizon_ms,
                                                retention_floor_ms, batch, parsed,
                                                deadline_floor_ms)
        """The last watermark before the jump to +infinity that ends the stream."""
        for token, planned in zip(self._tokens, parsed, strict=True):
            _PARSED[token] = planned
            weakref.finalize(self, _PARSED.pop, token, None)

    def _plan(self, lines: Iterable[tuple[Source, _Scanned]], lag: int, horizon_ms: int,
              retention_floor_ms: int, batch: int, parsed: list[dict[str, list[bytes]]],
              deadline_floor_ms: int) -> tuple[list[TestStream], int]:
        partitions = self.partitions
        out = _Events(batch, partitions)
        joins = _JoinsSeen(batch, deadline_floor_ms)
        max_seen: int | None = None
        latest = 0  # the largest event time or opened_at: no deadline is earlier than it
        longest = 0
        for source, ((t, deadline_ms, join_id, carried), result) in lines:
            path = source[0]
            part = partition_of(join_id, partitions)
            counts = self._counts[part]
            index = counts.get(path, 0)
            counts[path] = index + 1
            parsed[part].setdefault(path, []).append(result)
            longest = max(longest, deadline_ms)
            joins.deadline(deadline_ms)
            if t is not None and (max_seen is None or t > max_seen):
                max_seen = t
            times = [x for x in (t, carried) if x is not None]
            if times:
                latest = max(latest, *times)
            bound = None if max_seen is None else max_seen - lag
            if bound is not None and (out.watermark is None or bound > out.watermark):
                seen = joins.earliest(join_id)
                if (t is not None and t < bound) or (
                        seen is not None and seen + retention_floor_ms + 1 <= bound) or \
                        joins.due(out.since, bound):
                    # the earlier lines first, then the watermark moves up to the bound: every
                    # timer of this line's join it passes fires before the line arrives
                    out.advance(bound)
                    joins.passed(bound)
            if join_id in out.due:
                # an earlier line of this join in the pending event may have set a timer
                # behind the watermark (a line behind it): it fires before this line
                out.barrier()
            out.add(part, path, index, t if t is not None else (
                out.watermark if out.watermark is not None else max_seen or 0))
            if join_id is not None and times:
                joins.delivered(join_id, times)
            if t is not None and max_seen is not None:
                self.largest_lag_ms = max(self.largest_lag_ms, max_seen - t)
            if t is not None and out.watermark is not None and t < out.watermark:
                self.behind += 1
                if join_id is not None:
                    out.due.add(join_id)  # behind the watermark: it may decide its join at once
        # deadlines are capped at the end of year 9999 (MAX_MS), so no decision timer is later
        # than MAX_MS + 1 (a horizon of a huge deadline_s would pass Beam's largest timestamp)
        final = min(min(max(max_seen or 0, latest) + longest, MAX_MS) + horizon_ms + 1,
                    MAX_MS + 2)
        end = max(final, out.watermark or final)
        if out.watermark is None or end > out.watermark:
            out.advance(end)
        out.barrier()
        self.events = out.events
        return [stream.advance_watermark_to_infinity().with_output_types(RUN_TYPE)
                for stream in out.streams], end

    def expand(self, pbegin: PBegin) -> pvalue.DoOutputsTuple:
        if self.partitions > 1:
            raise ValueError("a replay split into partitions is applied one partition at a "
                             "time (part)")
        return _ReplayPart(self, 0).expand(pbegin)  # its steps as this one's: Read/Stream...

    def part(self, partition: int) -> beam.PTransform[PBegin, pvalue.DoOutputsTuple]:
        """The replay of the joins of one partition (``partition_of``), from 0 to
        ``partitions - 1``: the lines of those joins (partition 0: and the lines the join
        does not take), in the same events, with the same watermark moves (a new transform
        each time: one per job)."""
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} of a replay in {self.partitions}")
        return _ReplayPart(self, partition)


class _ReplayPart(beam.PTransform[PBegin, pvalue.DoOutputsTuple]):
    """One partition of a ``Replay``: its stream of runs, parsed (``_ParseRuns``)."""

    def __init__(self, replay: Replay, partition: int) -> None:
        super().__init__()
        self._replay, self._partition = replay, partition

    def expand(self, pbegin: PBegin) -> pvalue.DoOutputsTuple:
        replay, part = self._replay, self._partition
        return (pbegin
                | "Stream" >> replay._streams[part]
                | "Parse" >> beam.ParDo(_ParseRuns(dict(replay._counts[part]),
                                                   replay._tokens[part], replay._scan,
                                                   replay.partitions > 1))
                .with_output_types(RECORD_TYPE).with_outputs(DEAD_LETTER, main=RECORDS))


def partition_of(join_id: str | None, partitions: int) -> int:
    """The partition of a split replay that replays a line of ``join_id`` (a join's lines all
    go to one: a stable hash of its id, CRC-32); a line the join does not take (None: no join
    id), partition 0."""
    if join_id is None or partitions == 1:
        return 0
    return zlib.crc32(join_id.encode("utf-8", "surrogatepass")) % partitions


def build_replay(lines: Iterable[tuple[bytes, Source]], max_disorder_s: float,
                 horizon_ms: int, scan: MessageScan, retention_floor_ms: int = 0,
                 batch: int = 50_000, deadline_floor_ms: int = 0, partitions: int = 1,
                 processes: int = 1) -> Replay:
    """``Replay(...)``: the replay of ``lines`` (see ``Replay``)."""
    return Replay(lines, max_disorder_s, horizon_ms, scan, retention_floor_ms, batch,
                  deadline_floor_ms, partitions, processes)
