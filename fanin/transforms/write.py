"""Beam composite: write one output (closes, late or dead_letter) as files under a folder.

Guarantees:
- Files are newline-delimited JSON (``*.jsonl``), and Parquet as well (or instead) when asked,
  in ``OUTPUT/<kind>/``. Each file is written under a temporary name and renamed into place,
  so a crash never leaves a half-written file that looks complete; a retried bundle rewrites
  the same name with the same content.
- Lines within a file are sorted, so the same input gives byte-identical files.
- Bounded, and a finite stream (a replay, ``AT_END``): two phases, the way Beam's own file
  sinks write. Each bundle encodes its objects, sorts them per shard and writes them to
  hidden temporary files (``.<kind>-<run token>-s<shard>-<random>.tmp-lines``, never an
  output's suffix, written like every output file): one per shard, or one per
  ``spill_chars`` characters of a shard's lines, so a bundle holds at most that much of a
  shard in memory; a finalize step per shard (shards in parallel) merges the shard's sorted
  temporary files into ``<kind>-<run>-p0000-s<shard>`` (``<run>``: ``all`` when bounded,
  the job token of a stream; a single JSONL file is renamed into place; several are merged
  as they are read, never held whole, unless Parquet is asked for) and then deletes every
  temporary file of the run for that shard, also those of bundle attempts that failed.
  No output line crosses a shuffle. An output made by several steps (a tuple of
  PCollections) is spilled by each step where it is made, and only the temporary files'
  names are merged: FnApiRunner holds a ``Flatten`` of PCollections from different stages
  whole between the stages (a hot join's 900,000 dead letters: ~340 MiB).
- Streaming: nothing is ever dropped by lateness, whatever the event times. Outputs are not
  windowed by event time: they stay in the global window (whose end is the end of time, so no
  output is ever behind it). A finite stream (``AT_END``) writes as a bounded run does, its
  files complete when the stream ends: each bundle's lines go to temporary files as they are
  made (no pending lines held in memory, and no line crosses the shuffle; on the local runner
  every line that crosses a step costs a committed bundle's work: ~11 % of a replay of 206,728
  lines, docs/performance.md), and the finalize merges at most ``MERGE_FAN_IN`` files at once
  (a replay spills a file per bundle). A live stream writes a shard's pending lines as one file when
  the early firing (``early``, below) says so, and the rest when the input ends (drain).
  Each firing is a pane of the global window: the file is
  ``<kind>-<job token>-p<pane index>-s<shard>``.
  The pane index is assigned by the runner's GroupByKey and is part of its committed output,
  and the job token is fixed when the job is built (it travels in the pickled DoFn), so a
  retried write bundle rewrites the same name with the same lines (idempotent within a job).
  The token differs per launch: a replacement job (drain, then launch; or ``--update``, whose
  pane indices go on) never overwrites an earlier job's files.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.pvalue import PCollection
from apache_beam.transforms import trigger, window
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue

from fanin.core.outcomes import encode_line
from fanin.io.files import atomic_move, atomic_write

__all__ = ["AT_END", "BY_COUNT_OR_TIME", "BY_TIME", "EARLY_FIRINGS", "FORMATS", "WriteOutput",
           "finalize_spills", "merged_spills", "new_token", "spilled_in_this_process"]

FORMATS = ("jsonl", "parquet")
# When a streaming write's pending lines of one shard are written (its early firing):
AT_END = "end"  # never before the input ends: a finite stream (a replay), written in two phases
BY_TIME = "time"  # ``window_s`` seconds of processing time passed since the first of them
BY_COUNT_OR_TIME = "count_or_time"  # ``pane_lines`` of them are pending, or ``BY_TIME``
EARLY_FIRINGS = (AT_END, BY_TIME, BY_COUNT_OR_TIME)
# A bundle (bounded, replay) writes a shard's pending lines as one sorted temporary file once
# they hold this many characters (~16-40 MiB of Python strings per shard, by line length)
SPILL_CHARS = 16 * 1024 * 1024
# The most temporary files one merge reads at once: a replay spills a file per bundle and
# shard (thousands when it splits into thousands of events), and a process may hold only so
# many open (often 1,024; 256 on macOS)
MERGE_FAN_IN = 128


def new_token() -> str:
    """A fresh job token: 12 random hexadecimal digits."""
    return uuid.uuid4().hex[:12]


def _base_name(kind: str, pane_index: int, shard: int, run: str = "all") -> str:
    """An output file's name without suffix: bounded runs write pane 0 of each shard as
    ``run`` ``all``; streaming runs name ``run`` by the job token."""
    return f"{kind}-{run}-p{pane_index:04d}-s{shard:03d}"


def _write_lines(path: str, lines: list[str]) -> None:
    """``lines``, each ended by a newline, as UTF-8 in ``path`` (written atomically, encoded
    4,096 lines at a time: no copy of the whole text is made)."""
    def write(handle: BinaryIO) -> None:
        for start in range(0, max(len(lines), 1), 4096):
            handle.write(("\n".join(lines[start:start + 4096]) + "\n").encode("utf-8"))

    atomic_write(path, write)


def _write_shard(folder: str, kind: str, formats: Sequence[str], base: str,
                 ordered: list[str]) -> list[str]:
    """Write one shard's sorted lines as ``base.jsonl`` and/or Parquet; the paths written."""
    written = []
    if "jsonl" in formats:
        path = FileSystems.join(folder, base + ".jsonl")
        _write_lines(path, ordered)
        written.append(path)
    if "parquet" in formats:
        from fanin.io.parquet import write_parquet

        written.extend(write_parquet(kind, [json.loads(x) for x in ordered], folder, base))
    return written


class _WriteFiles(beam.DoFn):
    """Streaming: one file set per pane and shard."""

    def __init__(self, folder: str, kind: str, formats: Sequence[str], token: str) -> None:
        self._folder = folder
        self._kind = kind
        self._formats = tuple(formats)
        self._token = token

    def process(self, element: tuple[int, Iterable[str]],
                pane: Any = beam.DoFn.PaneInfoParam) -> Iterable[str]:
        shard, lines = element
        ordered = sorted(lines)
        if not ordered:
            return
        yield from _write_shard(self._folder, self._kind, self._formats,
                                _base_name(self._kind, pane.index, shard, self._token),
                                ordered)


class _SpillBundles(beam.DoFn):
    """First phase: a bundle's lines, encoded and sorted per shard, go to temporary
    files, a shard's next file each time its pending lines reach ``spill_chars`` characters;
    outputs ``(shard, temporary path)`` for each file once the bundle's files are complete."""

    def __init__(self, folder: str, kind: str, shards: int, token: str,
                 spill_chars: int = SPILL_CHARS) -> None:
        self._folder, self._kind, self._shards, self._token = folder, kind, shards, token
        self._spill_chars = spill_chars

    def start_bundle(self) -> None:
        self._lines: dict[int, list[str]] = {}
        self._chars: dict[int, int] = {}
        self._spilled: list[tuple[int, str]] = []

    def process(self, obj: dict[str, Any]) -> None:
        shard, line = _encode(obj, self._shards)
        lines = self._lines.get(shard)
        if lines is None:
            self._lines[shard] = [line]
            self._chars[shard] = len(line)
        else:
            lines.append(line)
            self._chars[shard] += len(line)
        if self._chars[shard] >= self._spill_chars:
            self._spill(shard)

    def _spill(self, shard: int) -> None:
        """Write the shard's pending lines, sorted, as one temporary file."""
        lines = self._lines.pop(shard)
        del self._chars[shard]
        lines.sort()
        path = _temp_file(self._folder, self._kind, self._token, shard)
        _write_lines(path, lines)
        self._spilled.append((shard, path))

    def finish_bundle(self) -> Iterator[WindowedValue]:
        for shard in sorted(self._lines):
            self._spill(shard)
        for spilled in self._spilled:
            yield GlobalWindows.windowed_value(spilled)
        self._spilled = []


class _Finalize(beam.DoFn):
    """Second phase: one shard's temporary files -> its output file set (``run`` in its
    name); then every temporary file of the run for that shard (failed bundle attempts' too)
    is deleted.

    Safe to retry, as Beam's file sinks' finalize is: the temporary files are deleted only
    after the shard's output files are complete, so a retry that finds one of them gone
    (a partial success: renamed, or cleanup begun) counts the shard as written and only
    finishes the cleanup. It fails loudly if the output file it would have renamed into place
    is missing too.
    """

    def __init__(self, folder: str, kind: str, formats: Sequence[str], token: str,
                 run: str = "all") -> None:
        self._folder, self._kind, self._formats = folder, kind, tuple(formats)
        self._token, self._run = token, run

    def process(self, element: tuple[int, Iterable[str]]) -> Iterator[str]:
        shard, spilled = element
        paths = sorted(spilled)
        base = _base_name(self._kind, 0, shard, self._run)
        if not all(FileSystems.exists(path) for path in paths):
            yield from self._written_earlier(base)
        elif len(paths) == 1 and self._formats == ("jsonl",):  # already sorted and complete
            final = FileSystems.join(self._folder, base + ".jsonl")
            atomic_move(paths[0], final)
            yield final
        elif self._formats == ("jsonl",):
            final = FileSystems.join(self._folder, base + ".jsonl")
            few = _fewer_than_fan_in(paths, functools.partial(
                _temp_file, self._folder, self._kind, self._token, shard))
            atomic_write(final, lambda handle: _merge_into(few, handle))
            yield final
        else:
            ordered: list[str] = []
            for path in paths:
                with FileSystems.open(path) as handle:
                    # split on "\n" only: a JSON line never holds a raw newline, but may hold
                    # other characters str.splitlines would split on (U+2028...)
                    ordered.extend(handle.read().decode("utf-8").split("\n")[:-1])
            ordered.sort()
            yield from _write_shard(self._folder, self._kind, self._formats, base, ordered)
        prefix = _temp_prefix(self._kind, self._token, shard)
        # and what a process killed while writing one left: atomic_write's ".<name>.tmp-..."
        patterns = [FileSystems.join(self._folder, name + "*") for name in (prefix, "." + prefix)]
        _delete_all([m.path for r in FileSystems.match(patterns) for m in r.metadata_list])

    def _written_earlier(self, base: str) -> list[str]:
        """A retry after a partial success: the shard's output files, which must exist."""
        patterns = [FileSystems.join(self._folder, "close_date=*", f"{base}.parquet")
                    if fmt == "parquet" and self._kind == "closes"  # one file per close date
                    else FileSystems.join(self._folder, f"{base}.{fmt}")
                    for fmt in FORMATS if fmt in self._formats]  # as _write_shard lists them
        found = [path for r in FileSystems.match(patterns)
                 for path in sorted(m.path for m in r.metadata_list)]
        if not found:
            raise FileNotFoundError(f"{self._folder}: temporary files of {base} are gone but "
                                    "its output files are not there")
        return found


# (token, folder) -> the temporary files ``(shard, path)`` the spill steps of a write that
# does not finalize committed in this process (``WriteOutput(finalize=False)``)
_SPILLED: dict[tuple[str, str], set[tuple[int, str]]] = {}


class _NoteSpills(beam.DoFn):
    """The spill steps' committed temporary files, noted for ``spilled_in_this_process`` (a
    retried bundle notes the same ones again: a set)."""

    def __init__(self, token: str, folder: str) -> None:
        self._key = (token, folder)

    def process(self, spilled: tuple[int, str]) -> None:
        _SPILLED.setdefault(self._key, set()).add(spilled)


def spilled_in_this_process(token: str, folder: str) -> list[tuple[int, str]]:
    """The temporary files ``(shard, path)`` that the writes of job ``token`` into ``folder``
    with ``finalize=False`` committed in this process (run by an in-process runner), sorted;
    forgotten once returned."""
    return sorted(_SPILLED.pop((token, folder), ()))


def _by_shard(spilled: Iterable[tuple[int, str]]) -> dict[int, list[str]]:
    shards: dict[int, list[str]] = {}
    for shard, path in spilled:
        shards.setdefault(shard, []).append(path)
    return shards


def merged_spills(folder: str, kind: str, token: str, spilled: Iterable[tuple[int, str]]
                  ) -> list[tuple[int, str]]:
    """``spilled`` (``(shard, temporary file)``, sorted files) with each shard's files merged
    into one new temporary file of the shard (the files merged are deleted): what one job of
    a split replay hands on, so that the final merge reads a file per job and shard, never
    more files at once than one job's finalize would."""
    merged: list[tuple[int, str]] = []
    for shard, paths in sorted(_by_shard(spilled).items()):
        if len(paths) > 1:
            new_file = functools.partial(_temp_file, folder, kind, token, shard)
            few = _fewer_than_fan_in(sorted(paths), new_file)
            path = new_file()
            atomic_write(path, functools.partial(_merge_into, few))
            _delete_all(sorted(set(paths) | set(few)))
            paths = [path]
        merged.append((shard, paths[0]))
    return merged


def finalize_spills(folder: str, kind: str, formats: Sequence[str], token: str,
                    spilled: Iterable[tuple[int, str]]) -> list[str]:
    """The second phase of a finite stream's write done outside the job: each shard's
    temporary files ``spilled`` (committed by spill steps of writes with ``finalize=False``
    and token ``token``, in any number of jobs) merged into the shard's file set, as one
    job's ``Finalize`` step makes it (the same names and bytes), then every temporary file of
    the shard deleted; the paths written. Safe to retry, as that step is."""
    shards = _by_shard(spilled)
    finalize = _Finalize(folder, kind, formats, token, token)
    return [path for shard in sorted(shards) for path in finalize.process((shard, shards[shard]))]


def _merge_into(paths: list[str], out: BinaryIO) -> None:
    """The lines of the sorted files ``paths``, merged in order, written to ``out`` as they
    are read. Lines are compared as UTF-8 bytes with their newline: byte order is code point
    order (the order ``str`` sorts in), and a JSON line holds no character below the newline
    (control characters are escaped), so a line sorts before any longer line it begins."""
    handles = [FileSystems.open(path) for path in paths]
    try:
        out.writelines(heapq.merge(*(iter(handle.readline, b"") for handle in handles)))
    finally:
        for handle in handles:
            handle.close()


def _fewer_than_fan_in(paths: list[str], new_file: Callable[[], str]) -> list[str]:
    """Sorted files with the lines of the sorted files ``paths``, at most ``MERGE_FAN_IN``:
    groups of that many are merged into new temporary files (named by ``new_file``: the
    shard's, deleted with its other temporary files) until few enough are left."""
    while len(paths) > MERGE_FAN_IN:
        merged = []
        for start in range(0, len(paths), MERGE_FAN_IN):
            group = paths[start:start + MERGE_FAN_IN]
            if len(group) == 1:
                merged.append(group[0])
                continue
            path = new_file()
            atomic_write(path, functools.partial(_merge_into, group))
            merged.append(path)
        paths = merged
    return paths


def _delete_all(paths: list[str]) -> None:
    """Delete ``paths``; a file already gone (deleted by a concurrent or earlier attempt of
    the same step) is not an error."""
    if not paths:
        return
    try:
        FileSystems.delete(paths)
    except BeamIOError:
        if any(FileSystems.exists(path) for path in paths):
            raise


def _temp_prefix(kind: str, token: str, shard: int) -> str:
    return f".{kind}-{token}-s{shard:03d}-"


def _temp_file(folder: str, kind: str, token: str, shard: int) -> str:
    """A fresh temporary file of the shard in ``folder``: ``_temp_prefix``, a random part."""
    return FileSystems.join(folder, _temp_prefix(kind, token, shard)
                            + f"{uuid.uuid4().hex}.tmp-lines")


def _encode(obj: dict[str, Any], shards: int) -> tuple[int, str]:
    """(shard by join_id, or by the message text for a dead letter, which has no join_id;
    the output line: ``encode_line``)."""
    key = obj.get("join_id") or obj.get("raw") or obj.get("raw_base64") or ""
    shard = zlib.crc32(key.encode("utf-8", "surrogatepass")) % shards if shards > 1 else 0
    return shard, encode_line(obj)


class WriteOutput(beam.PTransform[Any, PCollection[Any]]):
    """Dicts (one PCollection, or a tuple of them written as one output) -> files in
    ``folder``; outputs the paths written.

    Streaming: ``early`` chooses when a shard's pending lines are written before the input
    ends: ``AT_END`` never (a finite stream: written as a bounded run writes, see the module's
    guarantees), ``BY_TIME`` once ``window_s`` seconds (rounded up to whole seconds) of
    processing time passed since the first of them, ``BY_COUNT_OR_TIME`` that or once
    ``pane_lines`` are pending, whichever comes first. The runner executes the trigger, and
    which one to ask for depends on it (``fanin.pipelines.runner_choice.early_firing`` chooses):
    Beam 2.77's Python trigger code, which the local Python runners execute, fires a
    processing-time branch of ``AfterAny`` only once per window (apache/beam#21262), so there
    ``BY_TIME`` is the one that fires every ``window_s``; Prism 2.77 panics on a
    processing-time trigger of a finite stream, which ``AT_END`` does not set
    (docs/runners.md). ``token`` (letters and digits; default: random per instance) names
    this job's files (streaming) and temporary files; give the job's outputs one token.
    ``finalize`` False (a finite stream only): the write stops after its first phase, its
    committed temporary files noted in this process (``spilled_in_this_process``) for
    ``finalize_spills``: how a replay split across processes writes (each process replays
    some joins, and the planning process finalizes what they all spilled).
    """

    def __init__(self, folder: str, kind: str, formats: Sequence[str] = ("jsonl",),
                 streaming: bool = False, window_s: float = 60.0, shards: int = 1,
                 pane_lines: int = 10_000, token: str | None = None,
                 early: str = BY_COUNT_OR_TIME, finalize: bool = True) -> None:
        super().__init__()
        if not finalize and not (streaming and early == AT_END):
            raise ValueError("finalize=False is for a finite stream (early AT_END)")
        unknown = set(formats) - set(FORMATS)
        if unknown or not formats:
            raise ValueError(f"formats must be a non-empty subset of {FORMATS}")
        if window_s <= 0 or shards < 1 or pane_lines < 1:
            raise ValueError("window_s must be > 0, shards and pane_lines >= 1")
        if early not in EARLY_FIRINGS:
            raise ValueError(f"early must be one of {EARLY_FIRINGS}, got {early!r}")
        self._folder, self._kind, self._formats = folder, kind, tuple(formats)
        self._streaming, self._window_s, self._shards = streaming, window_s, shards
        self._pane_lines, self._early = pane_lines, early
        if token is not None and not (token.isascii() and token.isalnum()):
            raise ValueError(f"token must be letters and digits, got {token!r}")
        self._token = token or new_token()
        self._finalize = finalize

    def _early_trigger(self) -> trigger.TriggerFn:
        count = trigger.AfterCount(self._pane_lines)
        # Beam's processing-time delay is in whole seconds
        after_time = trigger.AfterProcessingTime(math.ceil(self._window_s))
        if self._early == BY_TIME:
            return after_time
        return trigger.AfterAny(count, after_time)

    def _two_phases(self, parts: tuple[PCollection[Any], ...]) -> PCollection[Any]:
        """Spill each bundle's lines to temporary files; once the input ends, one file set per
        shard (named ``all`` when bounded, by the job token when streaming)."""
        spills = tuple(
            part | f"SpillBundles{i or ''}" >> beam.ParDo(_SpillBundles(
                self._folder, self._kind, self._shards, self._token)).with_output_types(
                tuple[int, str])
            for i, part in enumerate(parts))
        spilled = spills[0] if len(spills) == 1 else spills | "MergeSpills" >> beam.Flatten()
        if not self._finalize:  # finalize_spills, once every job that spills has ended
            return spilled | "NoteSpills" >> beam.ParDo(_NoteSpills(self._token, self._folder))
        if self._streaming:  # a GroupByKey of a stream needs a trigger: once, at its end
            spilled = spilled | "AtEnd" >> beam.WindowInto(
                window.GlobalWindows(), trigger=trigger.AfterWatermark(),
                accumulation_mode=trigger.AccumulationMode.DISCARDING)
        return (
            spilled
            | "GroupSpills" >> beam.GroupByKey()
            | "Finalize" >> beam.ParDo(_Finalize(self._folder, self._kind, self._formats,
                                                 self._token,
                                                 self._token if self._streaming else "all"))
        )

    def expand(self, pcolls: PCollection[Any] | tuple[PCollection[Any], ...]
               ) -> PCollection[Any]:
        parts = pcolls if isinstance(pcolls, tuple) else (pcolls,)
        if not self._streaming or self._early == AT_END:
            return self._two_phases(parts)
        return (
            (parts[0] if len(parts) == 1 else parts | "Merge" >> beam.Flatten())
            | "Window" >> beam.WindowInto(
                window.GlobalWindows(),
                trigger=trigger.AfterWatermark(early=self._early_trigger()),
                accumulation_mode=trigger.AccumulationMode.DISCARDING)
            | "Encode" >> beam.Map(_encode, self._shards).with_output_types(tuple[int, str])
            | "GroupShards" >> beam.GroupByKey()
            | "WriteFiles" >> beam.ParDo(_WriteFiles(self._folder, self._kind, self._formats,
                                                     self._token))
        )
