"""The failures ``fanin run`` reports itself in one line, kept out of the runner's logs.

``fanin run`` says in one line, with its exit code, an input a worker could not read to its end
(``fanin.io.inputs.UnreadableInput``) and a step of the job that failed on a file (an
``OSError`` the local runner re-raised as "... [while running 'STEP']": a full disk, a folder
made read-only; ``fanin.runners.toolchain.runner_failure``). The runners report the same
failure too, several times and with tracebacks: the local runners log the exception; on Prism
and Flink, Beam's SDK worker (in the ``fanin`` process under the default ``LOOPBACK``
environment) prints its traceback to standard error and logs it, Prism relays it in its own
log, and Beam's job client logs the job's failure with the worker's traceback as text.

Guarantees (``ReportedFailures``, installed on the root logger's handlers for one run):
- records of Fanin's own loggers (``fanin``, ``fanin.*``) always pass;
- a record that carries an ``UnreadableInput`` (as the record's message, an argument, its
  exception, or the exception being handled where it is logged), or whose text names one
  (``UnreadableInput: ...``, a traceback relayed as text), is dropped; after one, so is
  every later record of Prism's relay of its own log (``PrismRunner``: the failed bundle and
  job) and of Beam's job-server processes (their shutdown), so that ``fanin run``'s line is
  the run's last; every other logger's later records pass (a runner that retries the bundle,
  Dataflow's, goes on logging what matters);
- a record of Beam's loggers at WARNING or above that logs an ``OSError`` of a step is dropped;
- any other record passes (Beam's retries of a network call, a job service's errors).

``worker_stderr`` drops the traceback Beam's SDK worker prints to standard error for an input
it could not read (and the newline ``print`` adds); everything else written to standard error
passes unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any, TextIO

__all__ = ["UNREADABLE", "ReportedFailures"]

# an UnreadableInput as a traceback gives it, as text: its message is group 1
UNREADABLE = re.compile(r"\bUnreadableInput: (.+)")


# the loggers of what the runner says of a failed job after the worker's error (Prism's log,
# the job servers' processes)
_RELAYS = frozenset({"PrismRunner", "apache_beam.utils.subprocess_server"})


class ReportedFailures(logging.Filter):
    """A log filter for one run of ``fanin run`` (the module docstring has its guarantees)."""

    def __init__(self) -> None:
        super().__init__()
        self.unreadable = False  # an input found unreadable was seen: its reports are dropped

    @classmethod
    def install(cls) -> ReportedFailures:
        """A new filter on each of the root logger's handlers, in place of an earlier run's."""
        reported = cls()
        for handler in logging.getLogger().handlers:
            for earlier in [f for f in handler.filters if isinstance(f, ReportedFailures)]:
                handler.removeFilter(earlier)
            handler.addFilter(reported)
        return reported

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "fanin" or record.name.startswith("fanin."):
            return True
        from fanin.io.inputs import UnreadableInput

        found = [record.msg, *(record.args if isinstance(record.args, tuple) else ()),
                 record.exc_info[1] if record.exc_info else None, sys.exc_info()[1]]
        errors = [error for error in found if isinstance(error, BaseException)]
        try:
            text = record.getMessage()
        except Exception:  # arguments that do not fit the message: the handler reports it
            text = str(record.msg)
        if any(isinstance(error, UnreadableInput) for error in errors) or \
                UNREADABLE.search(text):
            self.unreadable = True
            return False
        if self.unreadable and record.name in _RELAYS:
            return False
        if not record.name.startswith("apache_beam") or record.levelno < logging.WARNING:
            return True
        in_step = "[while running '" in text or \
            any("[while running '" in str(error) for error in errors)
        return not (in_step and any(map(_file_error, errors)))

    @contextlib.contextmanager
    def worker_stderr(self) -> Iterator[None]:
        """While a job runs: standard error without the SDK worker's printed traceback of an
        input it could not read."""
        original = sys.stderr
        quiet = _WorkerStderr(original, self)
        sys.stderr = quiet
        try:
            yield
        finally:
            if sys.stderr is quiet:
                sys.stderr = original


class _WorkerStderr:
    """Standard error, less a printed traceback that names an ``UnreadableInput`` (and the
    newline ``print`` writes after it, in the same thread); anything else is the stream's."""

    def __init__(self, stream: TextIO, reported: ReportedFailures) -> None:
        self._stream, self._reported = stream, reported
        self._dropped = threading.local()  # .last: this thread's last write was dropped

    def write(self, text: str) -> int:
        dropped = getattr(self._dropped, "last", False)
        self._dropped.last = False
        if text.startswith("Traceback (most recent call last):") and UNREADABLE.search(text):
            self._reported.unreadable = self._dropped.last = True
            return len(text)
        if dropped and text == "\n":  # print's end after the dropped traceback
            return len(text)
        return self._stream.write(text)

    def __enter__(self) -> _WorkerStderr:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stream.__exit__(kind, error, trace)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _file_error(error: BaseException | None) -> bool:
    """``error`` is, or was raised from or while handling, an ``OSError``."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
