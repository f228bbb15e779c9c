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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_move", "atomic_write", "nearest_existing"]


def nearest_existing(path: str) -> str:
    """``path`` made absolute, or its nearest ancestor that exists (a link to nothing exists:
    it is a name), the root at worst: where a file or folder to be made there would go."""
    ancestor = os.path.abspath(path)
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    return ancestor


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
        if not name or name.endswith("/"):
            raise IsADirectoryError(errno.EISDIR, "not a file name", name)
        hops = list(_hops(name))
        descriptor = next((d for d in map(_own_descriptor, hops) if d is not None), None)
        if descriptor is not None:  # the very descriptor, its offset shared with the shell
            with os.fdopen(os.dup(descriptor), "wb") as handle:
                write(handle)
            return
        target = _local_target(name, hops)
        if target is None:  # a pipe, a device, another process's descriptor: appended to
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


def _local_target(name: str, hops: list[str]) -> str | None:
    """The regular file to replace for the local path ``name`` (a symbolic link's target), or
    None when ``name`` is written in place (see the module docstring); ``hops``: ``_hops``."""
    try:
        mode = os.stat(name).st_mode  # follows links
    except FileNotFoundError:  # a new file (or a link to none yet: its target)
        return os.path.realpath(name)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "not a file name", name)
    if not stat.S_ISREG(mode) or any(hop.startswith(_DESCRIPTORS) for hop in hops):
        return None
    return os.path.realpath(name)


_DESCRIPTORS = ("/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/")
_STANDARD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_FD = re.compile(r"/(?:dev/fd|proc/(?:self|thread-self|(\d+))(?:/task/\d+)?/fd)/(\d+)")


def _hops(name: str) -> Iterator[str]:
    """The paths ``name`` leads through: itself (its folders' links resolved), then each
    symbolic link's target in turn (at most 40, the kernel's own limit)."""
    path = os.path.abspath(name)
    for _ in range(40):
        path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        yield path
        if not os.path.islink(path):
            return
        path = os.path.join(os.path.dirname(path), os.readlink(path))


def _own_descriptor(path: str) -> int | None:
    """The descriptor of this process that the path names (``/dev/stdout``, ``/dev/fd/N``,
    ``/proc/self/fd/N``, ``/proc/<this pid>/fd/N``), else None: written through it (not
    reopened), output lands where the shell's own writes around it expect it."""
    if path in _STANDARD:
        return _STANDARD[path]
    found = _FD.fullmatch(path)
    if found is None:
        return None
    pid, number = found.groups()
    return int(number) if pid is None or int(pid) == os.getpid() else None


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
