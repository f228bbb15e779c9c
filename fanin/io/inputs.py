"""The lines of an input file, read the way ``fanin run --input`` and ``fanin publish`` read it.

Guarantees:
- ``input_lines(path, max_line_bytes)`` opens ``path`` with Beam's ``FileSystems`` (local
  paths, ``gs://``, ...) and yields its lines as bytes, each with its line ending, in file
  order. A file whose name ends in ``.gz``, ``.bz2``, ``.deflate``, ``.zst``, ``.zstd``,
  ``.xz`` or ``.lzma`` is decompressed (the suffixes Beam's ``ReadFromText`` knows; gzip
  members, and bzip2, xz, zlib or zstd streams, written back to back are read one after the
  other); any other file is read as it is.
- Memory does not grow with the input: a compressed file is decompressed a little at a time,
  whatever its ratio (a few MB that expand to gigabytes of one line or of blank lines are
  never held), and a line longer than ``max_line_bytes`` (its ending not counted) is never
  held whole: it comes as a ``LongLine`` (``fanin.contracts.lines``) of its first bytes (more
  than ``max_line_bytes``, whole characters) and its size, the rest read and dropped. An
  empty file is no stream: it has no lines, compressed or not.
- A file that cannot be opened (no permission, gone since it was listed) raises
  ``UnreadableInput`` (a ``ValueError``) naming the file and the system's reason.
- A compressed file that cannot be decompressed (not of its suffix's format, corrupt part of
  the way, or cut short: its data end inside a compressed stream, which the codec tells)
  raises ``UnreadableInput`` naming the file and the last line read before it, never the
  codec's own error. ``check_start(path)`` opens the file (a local one; a compressed one
  wherever it is) and, when it is compressed, reads its first line, so a run refuses a file it
  cannot read before it starts.
"""

from __future__ import annotations

import bz2
import io
import lzma
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, cast

from fanin.contracts.lines import LongLine

__all__ = ["PUBSUB_LINE_BYTES", "UnreadableInput", "check_start", "input_lines", "stream_lines"]

# Pub/Sub's limit on a message's data (no line a topic takes is longer): ``fanin publish``'s
PUBSUB_LINE_BYTES = 10_000_000
_CHUNK = 1 << 16  # compressed bytes read at a time; decompressed bytes made per step (zlib)
# zstd bytes read and decompressed per step: its decompressor has no output limit, and a
# block of 4 bytes can make 128 KiB (8 MiB at most from 256 bytes)
_ZSTD_PIECE = 256
_DROPPED = 1 << 20  # bytes of a long line's rest read (and dropped) at a time


class UnreadableInput(ValueError):
    """An input file that cannot be opened, or a compressed one that cannot be decompressed."""


class _Streams(io.RawIOBase):
    """The decompressed bytes of compressed streams written back to back (gzip members, bzip2,
    xz, zlib or zstd streams), made a little at a time whatever the ratio: at most
    ``_CHUNK`` bytes a step (zstd, whose decompressor has no output limit: the output of
    ``_ZSTD_PIECE`` compressed bytes a step, at most 8 MiB). Data that end inside a stream
    raise ``EOFError``; an empty file is no stream (no bytes)."""

    def __init__(self, raw: BinaryIO, new: Callable[[], Any],
                 step: Callable[[Any, bytes], tuple[bytes, bytes]], read: int,
                 padding: bytes = b"") -> None:
        super().__init__()
        self._raw, self._new, self._step_of, self._read = raw, new, step, read
        self._padding = padding  # bytes that may follow a stream's end (xz's zeros)
        self._stream = new()
        self._input = b""  # compressed bytes not given to the stream yet
        self._begun = False  # the stream was given bytes
        self._made, self._at = b"", 0  # decompressed bytes, and how many of them were read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._at == len(self._made):
            if not self._step():
                return 0
        size = min(len(buffer), len(self._made) - self._at)
        buffer[:size] = memoryview(self._made)[self._at:self._at + size]
        self._at += size
        return size

    def _step(self) -> bool:
        """Decompress one step into ``_made``; False at the end of the data."""
        stream = self._stream
        if stream.eof:  # the next stream starts after this one's end (and its padding)
            rest = (stream.unused_data + self._input).lstrip(self._padding)
            while not rest:
                rest = self._raw.read(self._read)
                if not rest:
                    return False
                rest = rest.lstrip(self._padding)
            self._input = rest
            self._stream, self._begun = self._new(), False
            return True
        hungry = getattr(stream, "needs_input", True)  # (bz2, lzma: output held back)
        if hungry and not self._input:
            self._input = self._raw.read(self._read)
            if not self._input:
                if self._begun:
                    raise EOFError("Compressed file ended before the end-of-stream marker was "
                                   "reached")
                return False
        self._begun = True
        self._made, self._input = self._step_of(stream, self._input)
        self._at = 0
        return True


def _zlib_step(stream: Any, data: bytes) -> tuple[bytes, bytes]:
    """At most ``_CHUNK`` bytes made; the input it did not take comes back (none once the
    stream ends: the rest is its ``unused_data``, which may repeat ``unconsumed_tail``)."""
    made = stream.decompress(data, _CHUNK)
    return made, b"" if stream.eof else stream.unconsumed_tail


def _held_step(stream: Any, data: bytes) -> tuple[bytes, bytes]:
    """At most ``_CHUNK`` bytes made; the stream holds the rest of its input (bz2, lzma)."""
    return stream.decompress(data, _CHUNK), b""


def _zstd_step(stream: Any, data: bytes) -> tuple[bytes, bytes]:
    """The output of all of ``data`` (read ``_ZSTD_PIECE`` bytes at a time)."""
    return stream.decompress(data), b""


def _zstd() -> Any:
    import zstandard

    # the window Beam's reader allows (a larger one is refused, not held)
    return zstandard.ZstdDecompressor(max_window_size=2**31).decompressobj()


# a new decompressor, its step, how many compressed bytes to read at a time, and the bytes
# that may pad a stream's end
_Codec = tuple[Callable[[], Any], Callable[[Any, bytes], tuple[bytes, bytes]], int, bytes]


def _codec(path: str) -> _Codec | None:
    """The decompressor and its step for ``path``'s suffix, as Beam's ``ReadFromText``
    decompresses it (``CompressionTypes``: gzip, zlib for ``.deflate``, both xz and lzma
    formats...); None for any other name."""
    from apache_beam.io.filesystem import CompressionTypes

    codecs: dict[str, _Codec] = {
        CompressionTypes.GZIP: (lambda: zlib.decompressobj(zlib.MAX_WBITS | 16), _zlib_step,
                                _CHUNK, b""),
        CompressionTypes.DEFLATE: (zlib.decompressobj, _zlib_step, _CHUNK, b""),
        CompressionTypes.BZIP2: (bz2.BZ2Decompressor, _held_step, _CHUNK, b""),
        # xz's stream padding (zero bytes), as Beam's reader and xz(1) take it
        CompressionTypes.LZMA: (lzma.LZMADecompressor, _held_step, _CHUNK, b"\0"),
        CompressionTypes.ZSTD: (_zstd, _zstd_step, _ZSTD_PIECE, b""),
    }
    return codecs.get(CompressionTypes.detect_compression_type(path))


def _decompressing(path: str, raw: BinaryIO) -> BinaryIO:
    """``raw`` decompressed by ``path``'s suffix (``_codec``), or ``raw`` itself for any other
    name, buffered where it is not (Google Cloud Storage's reader, whose ``readline`` reads a
    byte at a time)."""
    codec = _codec(path)
    if codec is None:
        return raw if hasattr(raw, "peek") else io.BufferedReader(cast(Any, raw), _CHUNK)
    return io.BufferedReader(_Streams(raw, *codec), _CHUNK)


@contextmanager
def input_lines(path: str, max_line_bytes: int = PUBSUB_LINE_BYTES) -> Iterator[Iterator[bytes]]:
    """The lines of ``path`` (see the module docstring), while the file is open."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    if max_line_bytes < 1:
        raise ValueError("max_line_bytes must be >= 1")
    try:
        raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except OSError as exc:  # PermissionError, FileNotFoundError, ... (Beam's BeamIOError too)
        reason = exc.strerror or (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UnreadableInput(f"input {path} cannot be read ({reason})") from exc
    with raw, _decompressing(path, raw) as handle:
        yield stream_lines(handle, max_line_bytes, path)


def check_start(path: str) -> None:
    """Raise ``UnreadableInput`` when ``path`` cannot be opened (checked for local files: a
    remote plain file is opened by the job only), or is compressed and its first line cannot be
    decompressed (a file that is not of its suffix's format), before a job reads it in full."""
    from apache_beam.io.filesystem import CompressionTypes

    compressed = CompressionTypes.detect_compression_type(path) != CompressionTypes.UNCOMPRESSED
    if not compressed and "://" in path:
        return
    with input_lines(path) as lines:
        if compressed:
            next(lines, None)


def stream_lines(handle: BinaryIO, max_line_bytes: int, path: str | None = None
                 ) -> Iterator[bytes]:
    """The lines of ``handle`` with their endings; one longer than ``max_line_bytes`` as a
    ``LongLine`` of its first ``max_line_bytes + 1`` to ``max_line_bytes + 6`` bytes (whole
    UTF-8 characters, unless it is not UTF-8). With ``path`` (``handle`` decompresses it), a
    codec's error (or a stream cut short) raises ``UnreadableInput`` naming the last line
    read."""
    limit = max_line_bytes + 6  # beyond the limit by a cut character, and a "\r\n" ending
    readline = handle.readline
    read = 0
    try:
        while True:
            line = readline(limit)
            if len(line) < limit or line.endswith(b"\n"):
                if not line:
                    return
                read += 1
                yield line
                continue
            line = _long_line(readline, line, max_line_bytes)  # (the rest read: then counted)
            read += 1
            yield line
    except Exception as exc:  # the codec's error: zlib.error, lzma.LZMAError, EOFError...
        if path is None:
            raise
        raise _unreadable(path, read, exc) from exc


def _long_line(readline: Callable[[int], bytes], first: bytes, max_line_bytes: int) -> LongLine:
    """The ``LongLine`` of a line whose first bytes are ``first``; reads (and drops) its
    rest."""
    size, before, chunk = len(first), b"", first
    while not chunk.endswith(b"\n"):
        more = readline(_DROPPED)
        if not more:
            break
        size += len(more)
        before, chunk = chunk, more
    if chunk.endswith(b"\n"):
        size -= 2 if (chunk[-2:-1] or before[-1:]) == b"\r" else 1
    return LongLine.of(first[:size], max_line_bytes, size)  # (a "\r" of its ending: not)


def _unreadable(path: str, read: int, exc: Exception) -> UnreadableInput:
    """The error of a codec's ``exc`` after ``read`` lines of ``path``."""
    where = "at its start" if read == 0 else f"after line {read}"
    kind = type(exc).__qualname__
    if type(exc).__module__ != "builtins":
        kind = f"{type(exc).__module__}.{kind}"
    detail = str(exc).splitlines()[0] if str(exc) else ""
    cut = " (the file is cut short)" if isinstance(exc, EOFError) else ""
    verb = "read" if _codec(path) is None else "decompressed"  # (a plain file's read error)
    return UnreadableInput(f"input {path} cannot be {verb} {where}{cut} ({kind}: {detail})")
