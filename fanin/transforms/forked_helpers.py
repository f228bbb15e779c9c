"""Helper processes forked from this one, each applying one function to the batches it is
sent: how the bounded key and close steps use more than one core on the local in-process
runner (``fanin.transforms.parse``, ``fanin.transforms.join_bounded``). No Beam import.

Lifecycle: ``Helpers(work, count)`` forks nothing; the first ``submit`` forks the helpers
(a small input, decided before a batch fills, never forks). ``idle`` says whether a helper
is free; ``submit`` sends it a batch; ``finished`` returns the batches done so far (``wait``:
all of those sent); ``close`` ends the helpers. ``HelpedStep`` ties them to a Beam step's
DoFn: made in its ``setup``, ended at the end of a bundle or in its ``teardown``, failures
logged. ``in_order`` maps a function over an iterator of batches with helpers, in order.

Guarantees:
- Every batch submitted comes back from ``finished`` exactly once, with ``work(batch)`` as
  the helper computed it, or with ``None`` when no helper could be forked, the helper failed
  (``work`` raised, the helper died or closed its end, or it did not answer within
  ``patience_s`` when waited for: it is killed) or ``marshal`` refused the batch: the caller
  then does that batch itself, so each batch is done exactly once, here or there. A helper
  that failed takes no batch again; why it failed (what it raised, the signal that killed
  it) is in ``failures``, for the caller to report.
- A helper runs nothing of its parent after the fork but ``work``: it closes its copies of
  every helper's parent end (those of other ``Helpers`` too: a helper exits once its
  parent closes its end, which it sees only when no copy is open), and the files and
  folders it inherits but 0-2 (so no lock of its parent's files outlives the parent's own
  release; sockets and pipes stay: a library's threads that the fork restarts use them),
  leaves through ``os._exit`` whatever happens, ignores SIGINT (Ctrl-C reaches the whole
  process group, and the parent decides what it means), exits once its parent closes its
  end, and on Linux is killed when its parent dies, however it dies. ``close`` kills a
  helper at work (its batch is dropped) and reaps every helper forked.
- Batches and results travel over a socket pair per helper, in ``marshal``'s format (both
  ends are one interpreter; it takes plain data, ~2x faster than pickle for the close step's
  dicts): a result ``marshal`` refuses fails its batch, which the caller then does itself.
  ``marshal`` refuses subclasses of built-in types (the batch comes back undone), but
  writes a ``bytes`` subclass as plain bytes, its own attributes gone: a caller keeps such
  batches for itself. A helper holds one batch at a time.
- Memory: a helper shares its parent's pages until either writes them (fork's copy on
  write); it freezes the objects it inherits (``gc.freeze``), so its collector never walks,
  and so never copies, its parent's heap.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import marshal
import math
import os
import select
import signal
import socket
import stat
import struct
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar, cast

__all__ = ["FORKS", "PATIENCE_S", "HelpedStep", "Helpers", "in_order"]

FORKS = hasattr(os, "fork")  # POSIX; Windows has no fork

_LOG = logging.getLogger(__name__)
_B = TypeVar("_B")
_T = TypeVar("_T")
_SIZE = struct.Struct("<Q")
_DONE, _FAILED = b"d", b"f"
_PR_SET_PDEATHSIG = 1  # prctl(2)
# How long ``finished(wait=True)`` waits for a helper's answer before it kills the helper: a
# batch is ~20 ms of work, at most a few seconds for 16 MiB of large joins
PATIENCE_S = 300.0


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


def _close_files() -> None:
    """Close every descriptor above 2 open on a file or a folder. Sockets, pipes and the like
    stay open: a library with threads of its own (gRPC restarts its pollers in a forked
    child) fails on a closed one."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: the usual range
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own, or not open
                mode = os.fstat(fd).st_mode
                if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
                    os.close(fd)


def _ended(status: int | None) -> str:
    """How a helper that said nothing ended, from its wait status."""
    if status is not None and os.WIFSIGNALED(status):
        return f"it was killed by signal {os.WTERMSIG(status)}"
    if status is not None and os.WIFEXITED(status):
        return f"it exited with status {os.WEXITSTATUS(status)}"
    return "it ended"


def _reason(exc: BaseException) -> bytes:
    """What a helper says of its failure: the exception's type and first line."""
    first = (str(exc).splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}".encode("utf-8", "replace")


def _die_with(parent_pid: int) -> None:
    """On Linux, the kernel kills this helper when its parent dies (``PR_SET_PDEATHSIG``), at
    once rather than when the batch at work ends: a parent killed by SIGTERM or a second
    Ctrl-C leaves no helper behind."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before that took effect
        os._exit(1)


def _serve(sock: socket.socket, work: Callable[[_B], _T]) -> None:
    """The helper's life: batches in, results out, until its parent closes its end."""
    while True:
        batch = _receive(sock)
        if batch is None:
            return
        try:
            result = marshal.dumps(cast(Any, work(marshal.loads(batch))))  # noqa: S302 (its parent's)
        except Exception as exc:  # the parent does the batch itself, where it raises visibly
            _send(sock, _FAILED, _reason(exc))
            return
        _send(sock, _DONE, result)


# The parent's end of every helper's socket this process holds, of every ``Helpers``: a
# helper closes its copies, so that each helper sees its parent's end close (its signal to
# exit) once the parent closes it, whichever helpers were forked later
_PARENT_ENDS: set[socket.socket] = set()


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
            parent_pid = os.getpid()
            try:
                pid = os.fork()
            except OSError:  # EAGAIN (a process limit), ENOMEM
                parent.close()
                child.close()
                raise
        if pid == 0:  # the helper: never returns into its parent's code
            code = 0
            try:
                _die_with(parent_pid)
                gc.freeze()
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                # every helper's parent end (a helper sees its parent's end close only once
                # no copy is open), and its parent's files, whose locks (the output folder's
                # flock) must end with the parent's own release
                for end in (parent, *_PARENT_ENDS):
                    end.close()
                _close_files()
                _serve(child, work)
            except BaseException as exc:  # e.g. its parent went away while it sent a result
                code = 1
                with contextlib.suppress(BaseException):
                    _send(child, _FAILED, _reason(exc))
            finally:
                os._exit(code)
        child.close()
        _PARENT_ENDS.add(parent)
        self.sock, self.pid = parent, pid
        self.ended = False

    def kill(self) -> None:
        """SIGKILL: it may be at work on a batch nobody waits for."""
        if not self.ended:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def end(self) -> int | None:
        """Close the parent's end (the helper then exits) and reap the helper; its wait
        status (None if it was reaped elsewhere or had ended before)."""
        if self.ended:
            return None
        self.ended = True
        _PARENT_ENDS.discard(self.sock)
        self.sock.close()
        try:
            return os.waitpid(self.pid, 0)[1]
        except ChildProcessError:
            return None


class Helpers(Generic[_B, _T]):
    """Up to ``count`` helper processes applying ``work`` to batches (see the module
    docstring)."""

    def __init__(self, work: Callable[[_B], _T], count: int,
                 patience_s: float = PATIENCE_S) -> None:
        if count < 1 or not patience_s > 0:
            raise ValueError("count must be >= 1 and patience_s > 0")
        self._work, self._count, self._patience_s = work, count, patience_s
        self._all: list[_Helper] = []  # every helper forked
        self._free: list[_Helper] = []
        # by socket fd: the helper at work, its batch's ``keep`` and batch, when it was sent
        self._held: dict[int, tuple[_Helper, Any, _B, float]] = {}
        self._refused: list[tuple[Any, _B, _T | None]] = []  # batches marshal refused
        self.failures: list[str] = []  # why each failed helper failed, the caller's to report
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
            self._fork()
        if not self._free:  # none could be forked
            self._refused.append((keep, batch, None))
            return
        try:
            payload = marshal.dumps(cast(Any, batch))
        except ValueError as exc:  # a value marshal does not take: returned undone
            self._refused.append((keep, batch, None))
            self.failures.append(f"a batch could not be sent: {exc}")
            return
        helper = self._free.pop()
        with contextlib.suppress(OSError):  # it died: ``finished`` returns the batch undone
            _send(helper.sock, payload)
        self._held[helper.sock.fileno()] = (helper, keep, batch, time.monotonic())
        self._poll.register(helper.sock, select.POLLIN)

    def _fork(self) -> None:
        """Fork the helpers; one that cannot be (a process or file limit) is a failure, and
        the helpers forked so far serve."""
        for _ in range(self._count):
            try:
                helper = _Helper(self._work)
            except OSError as exc:
                self.failures.append(f"a helper could not be started: {exc}")
                return
            self._all.append(helper)
            self._free.append(helper)

    def finished(self, wait: bool = False) -> list[tuple[Any, _B, _T | None]]:
        """The batches whose helpers answered, ``(keep, batch, result)`` (result None: do the
        batch yourself); with ``wait``, every batch sent: a helper that has not answered
        ``patience_s`` after its batch was sent is killed, its batch returned undone (a
        helper that hangs, as a library's lock held at the fork could make it, never stalls
        the caller for longer)."""
        done, self._refused = self._refused, []
        while self._held and self._poll is not None:
            timeout_ms = 0
            if wait:
                due = min(sent for *_, sent in self._held.values()) + self._patience_s \
                    - time.monotonic()
                timeout_ms = max(0, math.ceil(due * 1000))
            ready = self._poll.poll(timeout_ms)
            if not ready and wait:
                self._kill_overdue(done)
                continue
            for fd, _ in ready:
                done.append(self._answer(fd))
            if not wait:
                break
        return done

    def _taken(self, fd: int) -> tuple[_Helper, Any, _B]:
        """The helper on ``fd``, and its batch, no longer held."""
        if self._poll is not None:
            self._poll.unregister(fd)
        helper, keep, batch, _ = self._held.pop(fd)
        return helper, keep, batch

    def _answer(self, fd: int) -> tuple[Any, _B, _T | None]:
        helper, keep, batch = self._taken(fd)
        return keep, batch, self._result(helper)

    def _kill_overdue(self, done: list[tuple[Any, _B, _T | None]]) -> None:
        """Kill every helper past its patience; its batch is returned undone."""
        now = time.monotonic()
        for fd in [fd for fd, (*_, sent) in self._held.items()
                   if now - sent >= self._patience_s]:
            helper, keep, batch = self._taken(fd)
            helper.kill()
            helper.end()
            self.failures.append(f"it did not answer within {self._patience_s:g} s (killed)")
            done.append((keep, batch, None))

    def _result(self, helper: _Helper) -> _T | None:
        try:
            reply = _receive(helper.sock)
        except OSError:
            reply = None
        if reply is None or reply[:1] != _DONE:
            status = helper.end()  # failed: never used again
            said = bytes(reply[1:]).decode("utf-8", "replace") if reply else ""
            self.failures.append(said or _ended(status))
            return None
        self._free.append(helper)
        result: _T = marshal.loads(memoryview(reply)[1:])  # noqa: S302 (its own helper's)
        return result

    def close(self) -> None:
        """End every helper forked: one not idle is killed first (its batch, a failed or
        interrupted bundle's, is dropped; it may be at work on it)."""
        for helper in self._all:
            if helper not in self._free:
                helper.kill()
            helper.end()
        self._all, self._free, self._held, self._refused, self._poll = [], [], {}, [], None


class HelpedStep:
    """The helpers of a step of a Beam job, mixed into its DoFn (before ``beam.DoFn``):
    ``processes - 1`` helpers applying ``_helper_work`` (none for ``processes`` 1), made by
    ``setup``, ended by ``_end_helpers`` (a bundle's end) or ``teardown``;
    ``_end_unfinished`` (a bundle's start) ends helpers that still hold batches of a bundle
    that failed; ``_report_failures`` logs once why each failed helper failed (a warning
    naming ``_step`` and what the step then does itself, ``_itself``)."""

    _step: str
    _itself: str
    _processes: int
    _helpers: Helpers[Any, Any] | None

    def _with_helpers(self, processes: int) -> None:
        if processes < 1:
            raise ValueError("processes must be >= 1")
        self._processes = processes
        self._helpers = None  # setup's

    def _helper_work(self, batch: Any) -> Any:
        """What a helper does with a batch."""
        raise NotImplementedError

    def setup(self) -> None:
        self._helpers = Helpers(self._helper_work, self._processes - 1) \
            if self._processes > 1 else None

    def teardown(self) -> None:
        self._end_helpers()

    def _end_helpers(self) -> None:
        """The end of a bundle whose batches all came back: the helpers end now, and their
        memory and descriptors with them (the next bundle forks again)."""
        if self._helpers is not None:
            self._helpers.close()

    def _end_unfinished(self) -> None:
        if self._helpers is not None and self._helpers.holding:  # a failed bundle's batches
            self._helpers.close()

    def _report_failures(self) -> None:
        if self._helpers is None:
            return
        for reason in self._helpers.failures:
            _LOG.warning("fanin: a helper of the %s failed (%s); the %s %s", self._step, reason,
                         self._step, self._itself)
        self._helpers.failures.clear()


_NOT_YET: Any = object()  # a batch's result not known yet


def in_order(work: Callable[[_B], _T], batches: Iterable[_B], processes: int,
             for_helpers: Callable[[_B], bool], failed: Callable[[str], None]
             ) -> Iterator[tuple[_B, _T]]:
    """``(batch, work(batch))`` for each of ``batches``, in their order, with ``processes -
    1`` helpers (``Helpers``, forked at the first batch; none for 1): a helper takes a
    batch while this process reads the next; a batch that comes while every helper is busy,
    or that ``for_helpers`` refuses (say, one ``marshal`` would change), is done here, and so
    is a batch whose helper failed (``failed`` is told why, once per failure). At most
    ``2 * processes + 1`` batches are held at once. The helpers end when the iteration does
    (also when the caller stops early: the generator's ``close``)."""
    if processes < 2:
        for batch in batches:
            yield batch, work(batch)
        return
    helpers: Helpers[_B, _T] = Helpers(work, processes - 1)
    held: deque[list[Any]] = deque()  # [batch, its result or _NOT_YET], in order

    def answered(wait: bool) -> None:
        for slot, batch, result in helpers.finished(wait):
            slot[1] = work(batch) if result is None else result
        for reason in helpers.failures:
            failed(reason)
        helpers.failures.clear()

    try:
        for batch in batches:
            slot = [batch, _NOT_YET]
            held.append(slot)
            if helpers.idle() and for_helpers(batch):
                helpers.submit(batch, slot)
            else:
                slot[1] = work(batch)
            answered(wait=len(held) > 2 * processes)
            while held and held[0][1] is not _NOT_YET:
                done = held.popleft()
                yield done[0], done[1]
        answered(wait=True)
        while held:
            done = held.popleft()
            yield done[0], done[1]
    finally:
        helpers.close()
