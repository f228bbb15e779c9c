"""The failures ``fanin run`` reports itself in one line, kept out of the runner's logs.

``fanin run`` says in one line, with its exit code, an input a worker could not read to its end
(``fanin.io.inputs.UnreadableInput``) and a step of the job that failed on a file (an
``OSError`` the local runner re-raised as "... [while running 'STEP']": a full disk, a folder
made read-only; ``fanin.runners.toolchain.runner_failure``). The runners report the same
failure too, several times and with tracebacks: the local runners log the exception; on Prism
and Flink, Beam's SDK worker (in the ``fanin`` process under the default ``LOOPBACK``
environment) prints its traceback to standard error and logs it, Prism relays it in its own
log, and Beam's job client logs the job's failure with the worker's traceback as text; the
local runner with workers in threads or processes of their own (``--direct_num_workers 2
--direct_running_mode multi_threading|multi_processing``) fails the job with the worker's
traceback as text (``step_file_error``, ``worker_unreadable`` read its line from it), and
logs the records of its worker processes as one line each, their newlines escaped.

Guarantees (``ReportedFailures``, installed on the root logger's handlers for one run):
- records of Fanin's own loggers (``fanin``, ``fanin.*``) always pass;
- a record that carries an ``UnreadableInput`` (as the record's message, an argument, its
  exception, or the exception being handled where it is logged), or whose text names one
  (``UnreadableInput: ...``, a traceback relayed as text), is dropped; after one, so is
  every later record of Prism's relay of its own log (``PrismRunner``: the failed bundle and
  job) and of Beam's job-server processes (their shutdown), so that ``fanin run``'s line is
  the run's last; every other logger's later records pass (a runner that retries the bundle,
  Dataflow's, goes on logging what matters);
- a record of Beam's loggers at WARNING or above that logs an ``OSError`` of a step (as an
  exception, or named in its text with "[while running ") is dropped, and so is a record of
  another logger whose text ends with a worker's traceback of one (``step_file_error``:
  Prism's failed bundle, as the job client logs it); after one, so are Prism's and the job
  servers' later records, as after an unreadable input;
- after Ctrl-C stopped a job of worker processes (``interrupted``), every record but
  Fanin's is dropped: the stopping workers' and the runner's threads' reports of it;
- any other record passes (Beam's retries of a network call, a job service's errors).

``worker_stderr`` drops the tracebacks Beam's SDK workers print to standard error for a
failure ``fanin run`` reports (``reported_traceback``: an input a worker could not read, an
``OSError`` of a step; and the newline ``print`` adds): those of workers in the ``fanin``
process, and with ``multi_processing`` those of the worker processes, whose inherited
standard error goes through a pipe for the job's duration; after Ctrl-C stopped such a job,
everything written to standard error but Fanin's own line. Everything else written to
standard error passes unchanged and in order.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from types import FrameType, TracebackType
from typing import Any, TextIO

__all__ = ["UNREADABLE", "ReportedFailures", "step_file_error", "worker_unreadable"]

# an UnreadableInput as a traceback gives it, as text: its message is group 1
UNREADABLE = re.compile(r"\bUnreadableInput: (.+)")

# the names of Python's OSError classes (a full disk, a file too large, permissions...)
OS_ERRORS = frozenset(name for name, value in vars(builtins).items()
                      if isinstance(value, type) and issubclass(value, OSError))
# an OSError named in a traceback, also in a worker's log relayed with its newlines escaped
_FILE_ERROR_NAME = re.compile(rf"(?:\b|(?<=\\n))(?:{'|'.join(sorted(OS_ERRORS))}): ")
_ERROR_LINE = re.compile(r"(\w+): (.*\[while running '.*)")
_TRACEBACK = "Traceback (most recent call last):"


# the loggers of what the runner says of a failed job after the worker's error (Prism's log,
# the job servers' processes)
_RELAYS = frozenset({"PrismRunner", "apache_beam.utils.subprocess_server"})


class ReportedFailures(logging.Filter):
    """A log filter for one run of ``fanin run`` (the module docstring has its guarantees)."""

    def __init__(self) -> None:
        super().__init__()
        self.unreadable = False  # an input found unreadable was seen: its reports are dropped
        self.interrupted = False  # Ctrl-C stopped a job of worker processes: so is their noise
        self.failed_step = False  # a step's OSError was seen: its reports are dropped

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
        if self.interrupted:
            return False
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
        if (self.unreadable or self.failed_step) and record.name in _RELAYS:
            return False
        if record.levelno < logging.WARNING:
            return True
        if record.name.startswith("apache_beam"):
            in_step = "[while running " in text or \
                any("[while running " in str(error) for error in errors)
            step = in_step and (any(map(_file_error, errors)) or
                                _FILE_ERROR_NAME.search(text) is not None)
        else:  # a worker's traceback relayed as text (Prism's failed bundle, at the root)
            step = step_file_error(text) is not None
        self.failed_step = self.failed_step or step
        return not step

    @contextlib.contextmanager
    def _worker_processes_stderr(self) -> Iterator[None]:
        """While a job whose SDK workers are processes of their own runs: the standard error
        they inherit (file descriptor 2) goes through a pipe that drops their printed
        tracebacks of a failure ``fanin run`` reports in its line (``reported_traceback``);
        everything else written there, this process's own writes too, passes unchanged and
        in order."""
        sys.stderr.flush()
        original = os.dup(2)
        read_end, write_end = os.pipe()
        os.dup2(write_end, 2)
        os.close(write_end)
        relay = threading.Thread(target=_relay, args=(read_end, original, self), daemon=True,
                                 name="fanin-worker-stderr")
        relay.start()
        try:
            with self._noting_interrupts():
                yield
        finally:
            sys.stderr.flush()
            os.dup2(original, 2)  # the pipe ends when the workers, stopped by now, let it go
            relay.join(timeout=_RELAY_WAIT_S)
            if not relay.is_alive():  # else a worker still holds the pipe: the relay goes on
                os.close(original)

    @contextlib.contextmanager
    def _noting_interrupts(self) -> Iterator[None]:
        """Ctrl-C (SIGINT) sets ``interrupted`` before it stops the job as it would have
        (``KeyboardInterrupt``): the job's workers, processes of the same terminal, stop too,
        and what they and the runner's threads say of it is dropped (``fanin run`` says it in
        one line). A process that ignores SIGINT, or not the main thread, is left as it is."""
        if threading.current_thread() is not threading.main_thread() or \
                signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield
            return

        def interrupted(signum: int, frame: FrameType | None) -> None:
            self.interrupted = True
            signal.default_int_handler(signum, frame)

        signal.signal(signal.SIGINT, interrupted)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    @contextlib.contextmanager
    def worker_stderr(self, beam_args: Sequence[str] = ()) -> Iterator[None]:
        """While a job runs: standard error without the SDK workers' printed tracebacks of a
        failure ``fanin run`` reports in its line (``reported_traceback``): this process's
        ``sys.stderr``, and with ``--direct_running_mode multi_processing`` in ``beam_args``
        (the local runner's workers in processes of their own) the standard error those
        processes inherit."""
        original = sys.stderr
        quiet = _WorkerStderr(original, self)
        sys.stderr = quiet
        try:
            with (self._worker_processes_stderr() if _worker_processes(beam_args)
                  else contextlib.nullcontext()):
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
        if self._reported.interrupted:  # the stopping job's threads
            return len(text)
        dropped = getattr(self._dropped, "last", False)
        self._dropped.last = False
        if text.startswith(_TRACEBACK) and reported_traceback(text, self._reported):
            self._dropped.last = True
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


def _worker_processes(beam_args: Sequence[str]) -> bool:
    """The local runner's SDK workers run in processes of their own."""
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

    options = PipelineOptions(list(beam_args)).view_as(DirectOptions)
    return options.direct_running_mode == "multi_processing"


def reported_traceback(text: str, reported: ReportedFailures) -> bool:
    """Whether a printed traceback ``text`` is of a failure ``fanin run`` reports in its one
    line: an input a worker could not read (noted in ``reported``), an ``OSError`` of a
    step."""
    if UNREADABLE.search(text):
        reported.unreadable = True
        return True
    return step_file_error(text) is not None


# a chained traceback goes on after a blank line with one of these
_CHAINED = (b"During handling of the above exception, another exception occurred:\n",
            b"The above exception was the direct cause of the following exception:\n")
_RELAY_WAIT_S, _RELAY_HOLD = 10.0, 1 << 20


def _relay(read_end: int, out: int, reported: ReportedFailures) -> None:
    """Copies lines from the pipe ``read_end`` to the file descriptor ``out``, less each
    printed traceback (from a line ``Traceback (most recent call last):`` to the blank line
    ``print`` ends it with, chained tracebacks included) that ``reported_traceback`` takes;
    one held longer than ``_RELAY_HOLD`` bytes is copied as it is."""
    held: list[bytes] = []  # a traceback being read
    with open(read_end, "rb", buffering=0) as pipe:
        for line in _lines(pipe):
            if reported.interrupted:  # the stopping workers'
                continue
            if held and held[-1] == b"\n" and line not in _CHAINED and \
                    (len(held) < 2 or held[-2] not in _CHAINED):  # the traceback ended
                _release(held, out, reported)
                held = []
            if held or line.startswith(_TRACEBACK.encode()):
                held.append(line)
                if sum(map(len, held)) > _RELAY_HOLD:
                    _write(out, b"".join(held))
                    held = []
            else:
                _write(out, line)
    if held and not reported.interrupted:
        _release(held, out, reported)


def _lines(pipe: Any) -> Iterator[bytes]:
    """The lines of a pipe as they come (a last one without its newline at the end)."""
    rest = b""
    while chunk := pipe.read(65536):
        *lines, rest = (rest + chunk).split(b"\n")
        yield from (line + b"\n" for line in lines)
    if rest:
        yield rest


def _release(held: list[bytes], out: int, reported: ReportedFailures) -> None:
    """A printed traceback's lines: written to ``out`` unless ``fanin run`` reports it."""
    text = b"".join(held).decode("utf-8", "replace")
    if not reported_traceback(text, reported):
        _write(out, b"".join(held))


def _write(out: int, data: bytes) -> None:
    """All of ``data`` to the file descriptor ``out``."""
    view = memoryview(data)
    while view:
        view = view[os.write(out, view):]


def step_file_error(text: str) -> str | None:
    """The message of the last line of a traceback given as text (a worker's, relayed by the
    runner, after the runner's words on Prism) when that line is an ``OSError`` of a step,
    ``"OSError: cannot write ... [while running 'STEP']"`` (the local runner's re-raise):
    ``"cannot write ... [while running 'STEP']"``, as the local runner's own worker gives it;
    else None."""
    lines = [line for line in text.splitlines() if line.strip()]
    if _TRACEBACK not in text or not lines:
        return None
    last = _ERROR_LINE.fullmatch(lines[-1].strip())
    return last.group(2) if last is not None and last.group(1) in OS_ERRORS else None


def worker_unreadable(text: str) -> str | None:
    """The line of an input a worker could not read (``UnreadableInput``), from a traceback
    given as text: its last report, which names the step as the local runner's does."""
    found = UNREADABLE.findall(text) if text.startswith(_TRACEBACK) else []
    return found[-1].strip() if found else None
