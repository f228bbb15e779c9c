"""Atomic file writes, shared by the pipeline's output writer and the analysis tools.

Guarantee: ``atomic_write(path, write)`` calls ``write`` on a binary file named
``.<name>.tmp-<random>`` (hidden) beside ``path``, then renames it onto ``path``. Readers
see the old file, no file, or the complete new file; never a partial one under the final name (and a
temporary file never has an output's suffix, so tools that read ``*.jsonl`` / ``*.parquet``
skip it). Local paths are fsynced (file and folder) before and after the rename; other Beam
filesystems (``gs://...``) are written through ``FileSystems`` (create, then rename). On error
the temporary file is removed and the error re-raised.

``atomic_move(source, path)`` puts a complete file written earlier (by ``atomic_write``) in
place under the name ``path`` with one rename, with the same guarantees.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_move", "atomic_write"]


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """Create or replace ``path`` atomically with what ``write`` writes to the file handle.
    A local ``path`` that cannot be written (empty, a folder, under a file, no permission)
    raises ``OSError`` naming ``path`` as given, never the temporary file, which is removed."""
    name = os.fspath(path)
    folder, slash, base = name.rpartition("/")  # a local path or a Beam filesystem's
    tmp = f"{folder}{slash}.{base}.tmp-{uuid.uuid4().hex}"  # hidden: readers skip it
    if "://" in name:
        _remote(name, tmp, write)
        return
    try:
        if not name or os.path.isdir(name):
            raise IsADirectoryError(errno.EISDIR, "not a file name", name)
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        atomic_move(tmp, name)
    except BaseException as exc:
        with contextlib.suppress(OSError):  # none was made when its folder is not one
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OSError(f"cannot write {name!r}: {exc.strerror or exc}") from None
        raise


def atomic_move(source: str, path: str) -> None:
    """Rename ``source`` (a complete file, e.g. from ``atomic_write``) onto ``path``."""
    if "://" in path:
        from apache_beam.io.filesystems import FileSystems

        if FileSystems.exists(path):
            FileSystems.delete([path])
        FileSystems.rename([source], [path])
        return
    os.replace(source, path)
    _sync_folder(Path(path).parent)


def _sync_folder(folder: Path) -> None:
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def _remote(name: str, tmp: str, write: Callable[[BinaryIO], object]) -> None:
    from apache_beam.io.filesystems import FileSystems

    try:
        with FileSystems.create(tmp) as handle:
            write(handle)
        atomic_move(tmp, name)
    except BaseException:
        if FileSystems.exists(tmp):
            FileSystems.delete([tmp])
        raise
