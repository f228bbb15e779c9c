"""The lines of an input file, read the way ``fanin run --input`` and ``fanin publish`` read it.

Guarantees:
- ``input_lines(path)`` opens ``path`` with Beam's ``FileSystems`` (local paths, ``gs://``,
  ...) and yields its lines as bytes, each with its line ending, in file order. A file whose
  name ends in ``.gz``, ``.bz2``, ``.deflate``, ``.zst``, ``.zstd``, ``.xz`` or ``.lzma`` is
  decompressed, as Beam's ``ReadFromText`` reads it; any other file is read as it is.
- A file that cannot be opened (no permission, gone since it was listed) raises
  ``UnreadableInput`` (a ``ValueError``) naming the file and the system's reason.
- A compressed file that cannot be decompressed (not of its suffix's format, or corrupt part of
  the way) raises ``UnreadableInput`` naming the file and the last line read before it, never
  the codec's own error. ``check_start(path)`` opens the file (a local one; a compressed one
  wherever it is) and, when it is compressed, reads its first line, so a run refuses a file it
  cannot read before it starts.
- A compressed stream cut short ends where it was cut (the codec cannot tell), as with
  ``ReadFromText``: its last, partial line is a message like any other, which the parse
  dead-letters.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["UnreadableInput", "check_start", "input_lines"]


class UnreadableInput(ValueError):
    """An input file that cannot be opened, or a compressed one that cannot be decompressed."""


@contextmanager
def input_lines(path: str) -> Iterator[Iterator[bytes]]:
    """The lines of ``path`` (see the module docstring), while the file is open."""
    from apache_beam.io.filesystems import FileSystems

    try:
        handle = FileSystems.open(path)
    except OSError as exc:  # PermissionError, FileNotFoundError, ... (Beam's BeamIOError too)
        reason = exc.strerror or (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UnreadableInput(f"input {path} cannot be read ({reason})") from exc
    with handle:
        yield iter(handle) if isinstance(handle, Iterable) else _decompressed(path, handle)


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


def _decompressed(path: str, handle: Any) -> Iterator[bytes]:
    """The lines of Beam's ``CompressedFile``, which reads them with ``readline`` only."""
    read = 0
    while True:
        try:
            line = handle.readline()
        except Exception as exc:  # the codec's error: zlib.error, lzma.LZMAError, OSError...
            where = "at its start" if read == 0 else f"after line {read}"
            kind = type(exc).__qualname__
            if type(exc).__module__ != "builtins":
                kind = f"{type(exc).__module__}.{kind}"
            detail = str(exc).splitlines()[0] if str(exc) else ""
            whole = "; its first 16 MiB of compressed data are read at once" if read == 0 else ""
            raise UnreadableInput(f"input {path} cannot be decompressed {where} "
                                  f"({kind}: {detail}){whole}") from exc
        if not line:
            return
        read += 1
        yield line
