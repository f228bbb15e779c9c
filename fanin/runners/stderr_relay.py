"""The standard error of the local runner's worker processes, less their printed tracebacks
of failures ``fanin run`` reports in its own line (``fanin.runners.reported_failures``).

The local runner's workers in processes of their own (``--direct_running_mode
multi_processing``) inherit file descriptor 2 and print there the traceback of every bundle
they fail. ``relayed_stderr`` puts a pipe there for a job's duration, read by a thread that
writes what comes to the original standard error through a ``TracebackFilter``.

Guarantees:
- ``TracebackFilter`` passes every line, in order, but each printed traceback that
  ``reported`` takes (its chained tracebacks and ``print``'s blank line included). A
  traceback is held from its ``Traceback (most recent call last):`` line until the line after
  its exception line (or the blank line after it, to see whether a chained one follows), at
  most ``HOLD_BYTES``; lines of one process written while another's traceback is held may
  come after it. Once ``stopped()`` (Ctrl-C stopped the job), it passes nothing.
- ``relayed_stderr`` yields a text stream on the original standard error for this process's
  own writes (they never wait in the pipe: ``fanin run``'s lines and logs keep their order);
  on exit it waits up to ``WAIT_S`` for the workers, stopped by then, to let the pipe go,
  and puts file descriptor 2 back, also when the job raised. A relay that cannot write (a
  closed standard error) drains the pipe all the same, so no worker blocks on it.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TextIO

__all__ = ["HOLD_BYTES", "WAIT_S", "TracebackFilter", "relayed_stderr"]

HOLD_BYTES, WAIT_S = 1 << 20, 10.0
_TRACEBACK = b"Traceback (most recent call last):\n"
# a chained traceback goes on after a blank line with one of these
_CHAINED = (b"During handling of the above exception, another exception occurred:\n",
            b"The above exception was the direct cause of the following exception:\n")
_IDLE_S = 0.25  # a traceback complete but for what may follow it is decided after this


class TracebackFilter:
    """Lines in, lines out, less the printed tracebacks ``reported`` takes (given each
    traceback's text, ended at its exception line). ``feed`` one line at a time (with its
    newline); ``flush`` when nothing came for a while (``end=False``: a complete traceback is
    decided) or at the end of the stream (everything held is decided or passed)."""

    def __init__(self, reported: Callable[[str], bool], stopped: Callable[[], bool]) -> None:
        self._reported, self._stopped = reported, stopped
        self._held: list[bytes] = []
        self._size = 0
        self._state = "idle"  # idle, frames, error (after it), blank (after that), chain

    def feed(self, line: bytes) -> list[bytes]:
        if self._stopped():
            self._reset()
            return []
        state = self._state
        if state == "idle":
            if line != _TRACEBACK:
                return [line]
            self._hold(line, "frames")
        elif state == "frames":
            if line.startswith((b" ", b"\t")) or line == b"\n":
                self._hold(line, "frames")
            else:
                self._hold(line, "error")
        elif state == "error" and line == b"\n":
            self._hold(line, "blank")
        elif state == "blank" and line in _CHAINED:
            self._hold(line, "chain")
        elif state == "chain" and line in (b"\n", _TRACEBACK):
            self._hold(line, "chain" if line == b"\n" else "frames")
        else:  # the traceback ended before this line
            return self._decided() + self.feed(line)
        if self._size > HOLD_BYTES:  # too long to be a traceback: passed as it is
            return self._passed()
        return []

    def flush(self, end: bool) -> list[bytes]:
        if self._stopped():
            self._reset()
            return []
        if self._state in ("error", "blank"):
            return self._decided()
        return self._passed() if end else []

    def _hold(self, line: bytes, state: str) -> None:
        self._held.append(line)
        self._size += len(line)
        self._state = state

    @property
    def holding(self) -> bool:
        """Lines of a traceback are held."""
        return bool(self._held)

    def _decided(self) -> list[bytes]:
        if self._reported(b"".join(self._held).decode("utf-8", "replace")):
            self._reset()
            return []
        return self._passed()

    def _passed(self) -> list[bytes]:
        held = self._held
        self._reset()
        return held

    def _reset(self) -> None:
        self._held, self._size, self._state = [], 0, "idle"


def _pump(read_end: int, out: int, lines: TracebackFilter) -> None:
    """Reads the pipe ``read_end`` to its end, writing what ``lines`` passes to ``out``."""
    rest = b""
    writable = True

    def write(chunks: list[bytes]) -> None:
        nonlocal writable
        data = memoryview(b"".join(chunks))
        while data and writable:
            try:
                data = data[os.write(out, data):]
            except OSError:  # a closed standard error: the pipe is drained all the same
                writable = False

    with open(read_end, "rb", buffering=0) as pipe:
        while True:
            if not select.select([pipe], [], [], _IDLE_S)[0]:
                write(lines.flush(end=False))
                if rest and not lines.holding:  # a line not ended yet, nothing before it held
                    write([rest])
                    rest = b""
                continue
            chunk = pipe.read(65536)
            if not chunk:
                break
            *complete, rest = (rest + chunk).split(b"\n")
            for line in complete:
                write(lines.feed(line + b"\n"))
    write(lines.feed(rest) if rest else [])
    write(lines.flush(end=True))


@contextlib.contextmanager
def relayed_stderr(reported: Callable[[str], bool], stopped: Callable[[], bool]
                   ) -> Iterator[TextIO]:
    """File descriptor 2 through a pipe and a ``TracebackFilter`` while the block runs (the
    module docstring); yields a stream on the original standard error for this process."""
    sys.stderr.flush()
    original = os.dup(2)
    own = open(os.dup(original), "w", encoding=sys.stderr.encoding or "utf-8",  # noqa: SIM115
               errors=sys.stderr.errors or "backslashreplace", buffering=1)
    read_end, write_end = os.pipe()
    relay = threading.Thread(target=_pump, daemon=True, name="fanin-worker-stderr",
                             args=(read_end, original, TracebackFilter(reported, stopped)))
    ours = [read_end, write_end]  # the pipe's ends this function still has to close
    try:
        os.dup2(write_end, 2)
        os.close(ours.pop())
        relay.start()
        ours.clear()  # the relay closes the read end when the pipe ends
        yield own
    finally:
        own.flush()
        sys.stderr.flush()
        os.dup2(original, 2)  # the pipe ends when the workers, stopped by now, let it go
        own.close()
        started = not ours
        for end in ours:
            os.close(end)
        if started:
            relay.join(timeout=WAIT_S)
        if not relay.is_alive():  # else a worker still holds the pipe: the relay goes on
            os.close(original)
