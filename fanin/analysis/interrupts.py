"""Ctrl-C around DuckDB calls made in the main thread (``fanin query``, ``fanin report``).

DuckDB looks at Python's pending signals while a call runs, and a Ctrl-C that lands inside
one comes out as DuckDB's own error (``RuntimeError: Query interrupted``; a failed read of a
registered Arrow table "...: KeyboardInterrupt"), or as a ``KeyboardInterrupt`` raised in a
callback while DuckDB is still inside the call, whose connection then refuses to close
("connection is busy"; at exit the process could abort). ``interrupts_held()`` keeps Ctrl-C
out of the calls instead: inside the block a Ctrl-C is only noted, and ``KeyboardInterrupt``
is raised at the next ``check()`` (which callers make between two DuckDB calls) or when the
block ends, so it always reaches the command as an interrupt (one line, exit 130).

Guarantees: Python's handler of SIGINT in force before the block is back when it ends,
however it ends; a Ctrl-C noted in the block is raised at its end even when the block ends
with another error (the user's interrupt wins). In a thread other than the main one (where
no signal handler can be set, and no signal arrives) nothing is held.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["interrupts_held"]


@contextlib.contextmanager
def interrupts_held() -> Iterator[Callable[[], None]]:
    """A block in which Ctrl-C is held; yields ``check()``, which raises
    ``KeyboardInterrupt`` once a Ctrl-C was held (see the module's guarantees)."""
    held: list[int] = []

    def check() -> None:
        if held:
            raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield check
        return

    def hold(signum: int, _frame: FrameType | None) -> None:
        held.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield check
    finally:
        # a handler installed from outside Python reads as None: the default one then
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None
                      else previous)
        check()
