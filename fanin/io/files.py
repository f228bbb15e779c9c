"""Atomic file writes, shared by the pipeline's output writer and the analysis tools.

Guarantee: ``atomic_write(path, write)`` calls ``write`` on a binary file named
``.<name>.tmp-<random>`` (hidden) beside ``path``, then renames it onto ``path``. Readers
see the old file, no file, or the complete new file; never a partial one under the final name (and a
temporary file never has an output's suffix, so tools that read ``*.jsonl`` / ``*.parquet``
skip it). Local paths are fsynced (file and folder) before and after the rename; other Beam
filesystems (``gs://...``) are written through ``FileSystems`` (create, then rename). On error
the temporary file is removed and the error re-raised.

A local ``path`` is the file it names: a symbolic link is followed, and its target (a regular
file, or none yet) is replaced atomically, the link kept. A descriptor of this process
(``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``, also through links) is written through
that very descriptor, as the shell's ``>`` writes it: output lands where the shell's own
writes before and after it expect it. Any other path that is not a regular file (a pipe, a
terminal, a device, another process's descriptor) is written in place, appended to. Neither
is ever replaced by a file (nothing is atomic there). A name ending in ``/`` is a folder's,
refused.

``atomic_move(source, path)`` puts a complete file written earlier (by ``atomic_write``) in
place under the name ``path`` with one rename (``path`` itself: a link there is replaced),
readers seeing the old file, no file or the new one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_move", "atomic_write"]


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """Create or replace ``path`` atomically with what ``write`` writes to the file handle
    (a pipe or a device: written in place; see the module docstring). A local ``path`` that
    cannot be written (empty, a folder, under a file, no permission) raises ``OSError`` naming
    ``path`` as given, never the temporary file, which is removed."""
    name = os.fspath(path)
    if "://" in name:  # a Beam filesystem's
        _remote(name, _temporary(name), write)
        return
    tmp = None
    try:
        descriptor = _own_descriptor(name)
        if descriptor is not None:  # the very descriptor, its offset shared with the shell
            with os.fdopen(os.dup(descriptor), "wb") as handle:
                write(handle)
            return
        target = _local_target(name)
        if target is None:  # appended to: a file behind /dev/stdout keeps what >> left there
            with open(name, "ab") as handle:
                write(handle)
            return
        tmp = _temporary(target)
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        atomic_move(tmp, target)
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):  # none was made when its folder is not one
                Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OSError(f"cannot write {name!r}: {exc.strerror or exc}") from None
        raise


def _temporary(name: str) -> str:
    """A hidden temporary name beside ``name``: readers skip it."""
    folder, slash, base = name.rpartition("/")
    return f"{folder}{slash}.{base}.tmp-{uuid.uuid4().hex}"


def _local_target(name: str) -> str | None:
    """The regular file to replace for the local path ``name`` (a symbolic link's target), or
    None when ``name`` is written in place (see the module docstring)."""
    if not name or name.endswith("/"):
        raise IsADirectoryError(errno.EISDIR, "not a file name", name)
    try:
        mode = os.stat(name).st_mode  # follows links, also /dev/stdout's
    except FileNotFoundError:  # a new file (or a link to none yet: its target)
        return os.path.realpath(name)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "not a file name", name)
    if not stat.S_ISREG(mode) or _through_a_descriptor(name):
        return None
    return os.path.realpath(name)


_DESCRIPTORS = ("/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/")
_STANDARD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_FD = re.compile(r"/(?:dev/fd|proc/self/fd|proc/(\d+)/fd)/(\d+)")


def _own_descriptor(name: str) -> int | None:
    """The descriptor of this process that ``name`` (or a symbolic link on its way) names:
    ``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``; else None. Written through it (not
    reopened), output lands where the shell's own writes around it expect it."""
    path = os.path.abspath(name)
    for _ in range(40):  # the kernel's own limit of links followed
        if path in _STANDARD:
            return _STANDARD[path]
        found = _FD.fullmatch(path)
        if found:
            pid, number = found.groups()
            return int(number) if pid is None or int(pid) == os.getpid() else None
        if not os.path.islink(path):
            return None
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return None


def _through_a_descriptor(name: str) -> bool:
    """Whether ``name``, or a symbolic link on its way, is a process's file descriptor."""
    path = os.path.abspath(name)
    for _ in range(40):  # the kernel's own limit of links followed
        if path.startswith(_DESCRIPTORS):
            return True
        if not os.path.islink(path):
            return False
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return False


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
