"""Helper processes forked from this one, each applying one function to the batches it is
sent: how the bounded close step uses more than one core on the local in-process runner
(``fanin.transforms.join_bounded``). No Beam import.

Lifecycle: ``Helpers(work, count)`` forks nothing; the first ``submit`` forks the helpers
(a small input, decided before a batch fills, never forks). ``idle`` says whether a helper
is free; ``submit`` sends it a batch; ``finished`` returns the batches done so far (``wait``:
all of those sent); ``close`` ends the helpers.

Guarantees:
- Every batch submitted comes back from ``finished`` exactly once, with ``work(batch)`` as
  the helper computed it, or with ``None`` when the helper failed (``work`` raised, or the
  helper died or closed its end) or ``marshal`` refused the batch: the caller then does that
  batch itself, so each batch is done exactly once, here or there. A helper that failed
  takes no batch again.
- A helper runs nothing of its parent after the fork but ``work``: it closes every file
  descriptor it inherits but 0-2 (so no lock of its parent's files outlives the parent's
  own release), leaves through ``os._exit`` whatever happens, ignores SIGINT (Ctrl-C
  reaches the whole process group, and the parent decides what it means), and exits once
  its parent closes its end (``close``, or the parent's exit, whatever ends it).
- Batches and results travel over a socket pair per helper, in ``marshal``'s format (both
  ends are one interpreter; it takes plain data, ~2x faster than pickle for the close step's
  dicts): a result ``marshal`` refuses fails its batch, which the caller then does itself. A
  helper holds one batch at a time.
- Memory: a helper shares its parent's pages until either writes them (fork's copy on
  write); it freezes the objects it inherits (``gc.freeze``), so its collector never walks,
  and so never copies, its parent's heap.
"""

from __future__ import annotations

import contextlib
import gc
import marshal
import os
import select
import signal
import socket
import struct
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

__all__ = ["FORKS", "Helpers"]

FORKS = hasattr(os, "fork")  # POSIX; Windows has no fork

_B = TypeVar("_B")
_T = TypeVar("_T")
_SIZE = struct.Struct("<Q")
_DONE, _FAILED = b"d", b"f"


def _send(sock: socket.socket, *parts: bytes) -> None:
    """One message: its parts, back to back (not joined: a batch is megabytes)."""
    sock.sendall(_SIZE.pack(sum(map(len, parts))))
    for part in parts:
        sock.sendall(part)


def _receive(sock: socket.socket) -> bytearray | None:
    """One message, or None if the other end closed first."""
    head = _exactly(sock, _SIZE.size)
    return None if head is None else _exactly(sock, _SIZE.unpack(head)[0])


def _exactly(sock: socket.socket, size: int) -> bytearray | None:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return buffer


def _open_max() -> int:
    """One more than the highest file descriptor a process may have."""
    try:
        return max(os.sysconf("SC_OPEN_MAX"), 1024)
    except (ValueError, OSError):
        return 65_536


def _serve(sock: socket.socket, work: Callable[[_B], _T]) -> None:
    """The helper's life: batches in, results out, until its parent closes its end."""
    while True:
        batch = _receive(sock)
        if batch is None:
            return
        try:
            result = marshal.dumps(cast(Any, work(marshal.loads(batch))))  # noqa: S302 (its parent's)
        except Exception:  # the parent does the batch itself, where it raises visibly
            _send(sock, _FAILED)
            return
        _send(sock, _DONE, result)


class _Helper:
    """One forked process and the parent's end of its socket."""

    sock: socket.socket
    pid: int

    def __init__(self, work: Callable[[_B], _T]) -> None:
        parent, child = socket.socketpair()
        with warnings.catch_warnings():
            # Python 3.12 warns of a fork while threads run (a lock one of them holds stays
            # held in the child); the helper runs ``work`` only, whose locks (logging's, the
            # import lock) Python resets in a forked child
            warnings.filterwarnings("ignore", "This process .* is multi-threaded",
                                    DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the helper: never returns into its parent's code
            code = 0
            try:
                gc.freeze()
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                # every descriptor but its socket's and 0-2 closed: the other helpers' ends (a
                # helper sees its parent's end close only once no copy is open) and its
                # parent's files, whose locks (the output folder's flock) must end with it
                keep = child.fileno()
                os.closerange(3, keep)
                os.closerange(keep + 1, _open_max())
                _serve(child, work)
            except BaseException:  # e.g. its parent went away while it sent a result
                code = 1
            finally:
                os._exit(code)
        child.close()
        self.sock, self.pid = parent, pid

    def end(self) -> None:
        """Close the parent's end (the helper then exits) and reap the helper."""
        self.sock.close()
        with contextlib.suppress(ChildProcessError):  # already reaped
            os.waitpid(self.pid, 0)


class Helpers(Generic[_B, _T]):
    """Up to ``count`` helper processes applying ``work`` to batches (see the module
    docstring)."""

    def __init__(self, work: Callable[[_B], _T], count: int) -> None:
        if count < 1:
            raise ValueError("count must be >= 1")
        self._work, self._count = work, count
        self._free: list[_Helper] = []
        self._held: dict[int, tuple[_Helper, Any, _B]] = {}  # by socket fd: a batch sent
        self._refused: list[tuple[Any, _B, _T | None]] = []  # batches marshal refused
        self._poll: select.poll | None = None

    def idle(self) -> bool:
        """Whether ``submit`` can send a batch now."""
        return bool(self._free) or self._poll is None

    @property
    def forked(self) -> bool:
        """Whether the helpers were forked (by the first ``submit``)."""
        return self._poll is not None

    @property
    def holding(self) -> int:
        """Batches submitted and not yet returned by ``finished``."""
        return len(self._held) + len(self._refused)

    def submit(self, batch: _B, keep: Any = None) -> None:
        """Send ``batch`` to an idle helper (``idle()`` must be true); ``keep`` (not sent)
        comes back with it."""
        if self._poll is None:  # the first batch: fork
            self._poll = select.poll()
            self._free = [_Helper(self._work) for _ in range(self._count)]
        try:
            payload = marshal.dumps(cast(Any, batch))
        except ValueError:  # a value marshal does not take: ``finished`` returns it undone
            self._refused.append((keep, batch, None))
            return
        helper = self._free.pop()
        with contextlib.suppress(OSError):  # it died: ``finished`` returns the batch undone
            _send(helper.sock, payload)
        self._held[helper.sock.fileno()] = (helper, keep, batch)
        self._poll.register(helper.sock, select.POLLIN)

    def finished(self, wait: bool = False) -> list[tuple[Any, _B, _T | None]]:
        """The batches whose helpers answered, ``(keep, batch, result)`` (result None: do the
        batch yourself); with ``wait``, every batch sent."""
        done, self._refused = self._refused, []
        while self._held and self._poll is not None:
            ready = self._poll.poll(None if wait else 0)
            if not ready:
                break
            for fd, _ in ready:
                helper, keep, batch = self._held.pop(fd)
                self._poll.unregister(fd)
                done.append((keep, batch, self._result(helper)))
            if not wait:
                break
        return done

    def _result(self, helper: _Helper) -> _T | None:
        try:
            reply = _receive(helper.sock)
        except OSError:
            reply = None
        if reply is None or reply[:1] != _DONE:
            helper.end()  # failed: never used again
            return None
        self._free.append(helper)
        result: _T = marshal.loads(memoryview(reply)[1:])  # noqa: S302 (its own helper's)
        return result

    def close(self) -> None:
        """End every helper (batches held are dropped: a failed bundle's)."""
        for helper, _, _ in self._held.values():
            helper.end()
        for helper in self._free:
            helper.end()
        self._free, self._held, self._refused, self._poll = [], {}, [], None
