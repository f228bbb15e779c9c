"""One run at a time per local output folder, and a mark on a folder whose run did not finish.

Guarantees (local folders; a ``gs://`` folder has neither, docs/reliability.md):
- ``OutputLock.acquire(output)`` creates ``OUTPUT/.fanin-run`` and holds an exclusive lock on
  it (``flock``) until ``finish`` or ``release``, or until the process ends, however it ends.
  A second run on the same folder, from this process or another, is refused at once
  (``FolderBusy``, naming the holder's process) before it checks, deletes or writes anything.
- ``finish()`` (the run wrote all of its outputs) deletes the mark, then lets the lock go;
  except for a run that continued (``continues``: a subscription's next run) a folder an
  unfinished subscription run had left, without ``--overwrite``: that run's missing outputs
  stay missing (its Pub/Sub messages were acknowledged when pulled, docs/reliability.md), so
  the mark stays, saying so (``earlier_unfinished``), until ``--overwrite`` or the user
  deletes it.
  ``release()`` (the run failed after writing) lets the lock go and leaves the mark: the
  folder's outputs are partial, and a run killed outright leaves it too. ``abandon()`` (the
  run was refused, or failed before it wrote anything) leaves the mark only if it was there.
- ``folder_state(output)``: ``RUNNING`` while a run holds the lock, ``UNFINISHED`` when the mark
  is there and nobody holds it (the run that made it stopped before its end), else None.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from typing import Any

__all__ = ["MARK", "RUNNING", "UNFINISHED", "FolderBusy", "OutputLock", "check_not_busy",
           "folder_state", "state_warning"]

MARK = ".fanin-run"
RUNNING, UNFINISHED = "running", "unfinished"

try:
    import fcntl
except ImportError:  # not POSIX: no lock; the mark still says a run did not finish
    fcntl = None  # type: ignore[assignment]


class FolderBusy(ValueError):
    """Another run holds the output folder."""


def _locked(fd: int, exclusive: bool) -> bool:
    """Take the lock on ``fd`` without waiting; False when another holds it."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _locked_a_moment(fd: int) -> bool:
    """The exclusive lock on ``fd``, tried for about a tenth of a second: a reader
    (``folder_state``) holds a shared one for an instant."""
    for _ in range(10):
        if _locked(fd, exclusive=True):
            return True
        time.sleep(0.01)
    return False


def _mark(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _holder(path: str) -> str:
    pid = _mark(path).get("pid")
    return f" (process {pid})" if isinstance(pid, int) else ""


def _busy(output: str) -> str:
    return (f"--output {output}: another fanin run is writing there"
            f"{_holder(os.path.join(output, MARK))}; wait for it to end, or choose another "
            "folder")


def check_not_busy(output: str) -> None:
    """``FolderBusy`` (what ``acquire`` would raise) while another run holds ``output``: for
    checks made before the lock is taken, so that they do not give another reason first."""
    if folder_state(output) == RUNNING:
        raise FolderBusy(_busy(output))


class OutputLock:
    """The lock of one run on one local output folder (see the module docstring)."""

    def __init__(self, path: str, fd: int, found: bool, kept: bool = False) -> None:
        self._path, self._fd, self._found = path, fd, found
        self._kept = kept  # finish keeps the mark: an earlier subscription run's loss stands
        self.changed = False
        """Whether the run changed the folder before it wrote (``--overwrite`` emptied it)."""

    def mark_changed(self) -> None:
        self.changed = True

    @classmethod
    def acquire(cls, output: str, continues: bool = False, overwrite: bool = False
                ) -> OutputLock:
        """Create ``output`` if needed and lock it for this run; ``FolderBusy`` if another run
        holds it. ``continues``: the run adds to an earlier run's files (a subscription's next
        run), which the mark says to a reader; ``overwrite``: it replaces them
        (``--overwrite``)."""
        os.makedirs(output, exist_ok=True)
        path = os.path.join(output, MARK)
        found = os.path.exists(path)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK |
                         getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise FolderBusy(f"--output {output}: {MARK} there is not a file; remove "
                                     "it")
                if not _locked_a_moment(fd):
                    raise FolderBusy(_busy(output))
                try:  # the mark a finishing run deleted after we opened it is not the lock
                    same = os.path.samestat(os.fstat(fd), os.stat(path))
                except FileNotFoundError:
                    same = False
                if same:
                    earlier = _mark(path) if found else {}
                    lost = earlier.get("continues") is True or \
                        earlier.get("earlier_unfinished") is True  # a Pub/Sub run's mark
                    os.ftruncate(fd, 0)
                    os.write(fd, json.dumps({"pid": os.getpid(), "started": time.time(),
                                             "continues": continues}).encode() + b"\n")
                    return cls(path, fd, found, continues and lost and not overwrite)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def finish(self) -> None:
        """All outputs written: delete the mark (keep it, saying why, when this run continued
        an unfinished run's folder), let the lock go."""
        if self._kept and not self.changed and self._fd >= 0:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, json.dumps({"pid": os.getpid(), "finished": time.time(),
                                            "continues": True,
                                            "earlier_unfinished": True}).encode() + b"\n", 0)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
        self.release()

    def abandon(self) -> None:
        """Nothing changed (the run was refused before it wrote or deleted anything): the mark
        is deleted unless an unfinished run had left it."""
        if self._found:
            self.release()
        else:
            self.finish()

    def release(self) -> None:
        """Let the lock go, the mark kept (the outputs are partial)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def folder_state(output: str) -> str | None:
    """``RUNNING``, ``UNFINISHED`` or None (see the module docstring)."""
    path = os.path.join(output, MARK)
    try:  # never blocks: a named pipe there is not a mark
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return UNFINISHED if _locked(fd, exclusive=False) else RUNNING
    finally:
        os.close(fd)


def state_warning(output: str) -> str | None:
    """One line for a reader of ``output`` when its outputs are not a finished run's."""
    state = folder_state(output)
    if state == RUNNING:
        return (f"{output}: a fanin run is still writing this folder; these are the outputs "
                "written so far")
    if state == UNFINISHED:
        mark = _mark(os.path.join(output, MARK))
        if mark.get("earlier_unfinished") is True:
            return (f"{output}: an earlier fanin run on this folder stopped before its end "
                    "(interrupted, killed or failed): the Pub/Sub messages it had received "
                    "and not written are missing from these outputs (the local runner "
                    "acknowledges a message when it pulls it); later runs' files joined "
                    f"these (delete {os.path.join(output, MARK)} to stop this warning)")
        if mark.get("continues") is True:
            return (f"{output}: the fanin run that wrote this folder stopped before its end "
                    "(interrupted, killed or failed); its outputs are partial: the Pub/Sub "
                    "messages it had received and not written are missing (the local "
                    "runner acknowledges a message when it pulls it); the next run of the "
                    "subscription receives the rest, and its files join these")
        return (f"{output}: the fanin run that wrote this folder stopped before its end "
                "(interrupted, killed or failed); its outputs are partial: run it again with "
                "--overwrite")
    return None
