"""Reading newline-delimited input files with their line numbers.

Guarantees:
- ``expand_inputs`` resolves globs with Beam's FileSystems (local paths, gs://, ...) and raises
  ``FileNotFoundError`` naming the pattern when it matches no file (a folder is not a file),
  and ``ValueError`` for a local match that is not a regular file (a named pipe, a device).
  A file matched twice is read once, also under two spellings of a local path (``./F``,
  ``d/../F``, a symbolic link: its first spelling is kept).
- ``numbered_lines`` yields ``(line_bytes, (path, n))`` for every line of a file, in file
  order (``n`` 1-based; a line longer than the run's ``--max-bytes`` as a ``LongLine`` of its
  first bytes, never held whole); the compact source becomes ``{"kind": "file", "file": path,
  "line": n}`` in a dead letter (``contracts.parsing.source_object``). The trailing ``\\n``
  (and a ``\\r`` before it) is removed; a line that is then empty is not a message and is
  skipped (NDJSON allows blank separators); every other line is yielded, valid or not. The
  rule is ``message_lines``, which ``fanin publish`` applies too, so a file means the same
  messages read directly or through Pub/Sub; both read a file with ``input_lines``
  (``fanin.io.inputs``), which decompresses a ``.gz``, ``.bz2``, ``.zst``, ``.xz`` ... file
  and raises ``UnreadableInput`` (a ``ValueError``) for one it cannot decompress.
- ``ReadNumberedLines`` is the Beam composite for bounded runs.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.pvalue import PBegin, PCollection

from fanin.contracts.lines import message_lines
from fanin.contracts.parsing import DEFAULT_MAX_BYTES, is_utf8
from fanin.io.inputs import check_start, input_lines

__all__ = ["CHUNK_BYTES", "CHUNK_MESSAGES", "Message", "ReadNumberedLines", "chunked",
           "expand_inputs", "for_helpers", "is_full", "numbered_chunks", "numbered_lines"]

Source = tuple[str, int]
# a message read from a file: ``(line bytes, (path, line number))``
Message = tuple[bytes, Source]
# A file's messages leave the read in chunks of this many, or of at least this many bytes
# (the last one: the rest): the key step takes a chunk at a time (``is_full``)
CHUNK_MESSAGES, CHUNK_BYTES = 10_000, 32 << 20


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """Every file the patterns match, sorted, de-duplicated (local files by their real path);
    a pattern matching none raises."""
    paths: list[str] = []
    for pattern in patterns:
        if os.path.isdir(pattern):
            raise FileNotFoundError(f"input is a folder, not a file: {pattern} (give a glob such "
                                    f"as {os.path.join(pattern, '*.jsonl')})")
        # Beam's local match finds nothing for a glob without a folder ("*.jsonl"): it is
        # asked in "./" and its matches given back as the user wrote them
        here = "://" not in pattern and not os.path.dirname(pattern)
        matched = [m.path.removeprefix("./") if here else m.path
                   for result in FileSystems.match([f"./{pattern}" if here else pattern])
                   for m in result.metadata_list if not os.path.isdir(m.path)]
        if "://" not in pattern:
            matched += _backslashed(pattern, matched)
        if not matched:
            raise FileNotFoundError(f"input matches no file: {pattern}")
        for path in matched:  # a pipe or a device would block the job's read, or never end
            if "://" in path:
                continue
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise ValueError(f"input is not a regular file (a pipe, a device or a socket): "
                                 f"{path}")
            if not is_utf8(path):  # its source in every output is text
                shown = os.fsencode(path).decode("utf-8", "backslashreplace")
                raise ValueError(f"input file name is not UTF-8: {shown} (rename it)")
        paths.extend(sorted(matched))
    unique: dict[str, str] = {}  # the file -> its first spelling
    for path in paths:
        unique.setdefault(path if "://" in path else os.path.realpath(path), path)
    return list(unique.values())


def _backslashed(pattern: str, matched: Sequence[str]) -> list[str]:
    """Local files ``pattern`` matches whose name holds a backslash, where its wildcards are
    in the file name only (``in/*.jsonl``): Beam's glob reads ``*`` as ``[^/\\]*`` (a
    backslash separates on Windows), so it skipped them without a word. A pattern with
    wildcards in its folders is left to Beam alone (the two globs differ there: Python's
    ``**/`` also matches no folder)."""
    if not glob.has_magic(pattern) or glob.has_magic(os.path.dirname(pattern)) or \
            "**" in pattern:
        return []
    found = glob.glob(pattern, include_hidden=True)
    return sorted({path for path in found if "\\" in path and not os.path.isdir(path)}
                  - set(matched))


def numbered_lines(path: str, max_bytes: int = DEFAULT_MAX_BYTES
                   ) -> Iterator[tuple[bytes, Source]]:
    """The messages of a file (``message_lines``) with their source ``(path, number)``; one
    longer than ``max_bytes`` as a ``LongLine`` (``input_lines``)."""
    with input_lines(path, max_bytes) as lines:
        for line, number in message_lines(lines):
            yield line, (path, number)


def numbered_chunks(path: str, max_bytes: int = DEFAULT_MAX_BYTES
                    ) -> Iterator[list[Message]]:
    """``numbered_lines`` in file order, in chunks (``chunked``)."""
    return chunked(numbered_lines(path, max_bytes))


def chunked(messages: Iterable[Message]) -> Iterator[list[Message]]:
    """``messages`` in their order, in chunks of ``CHUNK_MESSAGES`` messages or
    ``CHUNK_BYTES`` bytes (the first limit reached ends a chunk; the last one holds the
    rest)."""
    chunk: list[Message] = []
    size = 0
    for message in messages:
        chunk.append(message)
        size += len(message[0])
        if len(chunk) >= CHUNK_MESSAGES or size >= CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def is_full(chunk: list[Message]) -> bool:
    """Whether ``chunk`` reached a limit of ``chunked`` (the last chunk may not)."""
    return len(chunk) >= CHUNK_MESSAGES or sum(len(data) for data, _ in chunk) >= CHUNK_BYTES


def for_helpers(chunk: list[Message]) -> bool:
    """Whether a forked helper may take ``chunk`` (``fanin.transforms.forked_helpers``): a
    full one (the last is done by the process itself, so an input of one chunk forks
    nothing) of plain bytes. A ``LongLine`` (a long line's first bytes, and its size) would
    reach a helper as plain bytes (``marshal`` keeps no subclass), and its ``too_large`` dead
    letter would state the size of those bytes, not the line's."""
    return is_full(chunk) and all(type(data) is bytes for data, _ in chunk)


class ReadNumberedLines(beam.PTransform[PBegin, PCollection[Any]]):
    """Bounded read of files -> chunks of ``(line_bytes, source)`` (``numbered_chunks``):
    every non-empty line once, in file order.
    A compressed file whose start cannot be decompressed raises ``UnreadableInput`` here, when
    the job is built (``check_start``); the replay's plan reads every line when it is built."""

    def __init__(self, paths: Sequence[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__()
        if not paths:
            raise ValueError("ReadNumberedLines needs at least one path")
        self._max_bytes = max_bytes
        for path in paths:  # the job reads the files; a wrong format is refused before it runs
            check_start(path)
        self._paths = list(paths)

    def expand(self, pbegin: PBegin) -> PCollection[Any]:
        return (
            pbegin
            | "Paths" >> beam.Create(self._paths)
            | "Lines" >> beam.FlatMap(numbered_chunks, self._max_bytes)
        )
