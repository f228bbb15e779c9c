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
  exception; or, from the local runner's log of its worker processes, named in its text with
  "[while running ") is dropped, and so is a record of a portable job's messages (at the
  root, or Prism's) whose text ends with a worker's traceback of one (``step_file_error``);
  after one (or a worker's printed traceback of one), so are Prism's and the job servers'
  later records, as after an unreadable input. Other runners' records (Dataflow's, which
  retries a failed bundle) are heard;
- while Ctrl-C stops a job of worker processes (``interrupted``, until ``worker_stderr``
  ends), every record but Fanin's is dropped: the stopping workers' and the runner's
  threads' reports of it; so is every record but Fanin's of a thread other than the main
  one once ``fanin run`` said why its job failed, in a process that is its own
  (``quiet_failed_job``: a portable runner's worker in this process goes on with the
  bundles it was sent); and once a failure ``fanin run`` reports was seen (``reporting``),
  every record of Beam's SDK worker (``apache_beam.runners.worker.*``) of a thread other than
  the main one: the in-process worker's threads' reports of the job being torn down
  ("Failed to read inputs in the data plane", on Flink);
- any other record passes (Beam's retries of a network call, a job service's errors).

``worker_stderr`` drops the tracebacks Beam's SDK workers print to standard error for a
failure ``fanin run`` reports (``reported_traceback``: an input a worker could not read, an
``OSError`` of a step; and the newline ``print`` adds): those of workers in the ``fanin``
process, and with ``multi_processing`` those of the worker processes, whose inherited
standard error goes through a pipe for the job's duration (``fanin.runners.stderr_relay``;
this process's own writes and logs bypass it); while Ctrl-C stops such a job, everything
written to standard error but Fanin's own lines; once such a failure was seen, what threads
other than the main one write to it (the in-process worker's gRPC threads, "Exception in
thread run_worker_1-1", as Flink tears the job down). Everything else written to standard
error passes unchanged.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
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
_BUNDLE_FAILED = re.compile(r"RuntimeError: Bundle processing associated with \S+ has failed\.")


# the loggers of what the runner says of a failed job after the worker's error (Prism's log,
# the job servers' processes)
_RELAYS = frozenset({"PrismRunner", "apache_beam.utils.subprocess_server"})
# the local runner's log of its worker processes' records; the loggers of a portable job's
# messages (Beam's job client logs a failed job's message at the root, Prism its own)
_WORKER_LOGS = "apache_beam.runners.portability.local_job_service"
_JOB_LOGS = frozenset({"root", "PrismRunner"})
# the loggers of Beam's SDK worker (in this process under a portable runner's ``LOOPBACK``)
_WORKER = "apache_beam.runners.worker."


class ReportedFailures(logging.Filter):
    """A log filter for one run of ``fanin run`` (the module docstring has its guarantees)."""

    def __init__(self) -> None:
        super().__init__()
        self.unreadable = False  # an input found unreadable was seen: its reports are dropped
        self.interrupted = False  # Ctrl-C stopped a job of worker processes: so is their noise
        self.failed_step = False  # a step's OSError was seen: its reports are dropped
        self.job_failed = False  # said, in a process that is fanin's: its workers are quiet

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
        if self.interrupted or (record.thread != threading.main_thread().ident and (
                self.job_failed or (self.reporting and record.name.startswith(_WORKER)))):
            return False  # the stopping job's, the failed job's (``quiet_failed_job``), or
            # this process's SDK worker's once the failure it reports was seen
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
            step = in_step and (any(map(_file_error, errors)) or (
                record.name == _WORKER_LOGS and _FILE_ERROR_NAME.search(text) is not None))
        else:  # a worker's traceback relayed as text (the job client's record, Prism's)
            step = record.name in _JOB_LOGS and step_file_error(text) is not None
        self.failed_step = self.failed_step or step
        return not step

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

        try:  # a SIGINT before the handler is in place raises here: it is put back all the same
            signal.signal(signal.SIGINT, interrupted)
            yield
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    @contextlib.contextmanager
    def worker_stderr(self, beam_args: Sequence[str] = ()) -> Iterator[None]:
        """While a job runs: standard error without the SDK workers' printed tracebacks of a
        failure ``fanin run`` reports in its line (``reported_traceback``): this process's
        ``sys.stderr``, and with ``--direct_running_mode multi_processing`` in ``beam_args``
        (the local runner's workers in processes of their own) the standard error those
        processes inherit (``fanin.runners.stderr_relay``), where after Ctrl-C nothing of
        theirs passes. The root logger's handlers that wrote to ``sys.stderr`` write to the
        same stream as it meanwhile."""
        from fanin.runners.stderr_relay import relayed_stderr

        original = sys.stderr
        processes = _worker_processes(beam_args)
        try:
            with (relayed_stderr(self.reported_traceback, lambda: self.interrupted) if processes
                  else contextlib.nullcontext(original)) as stream:
                quiet = _WorkerStderr(stream, self)
                sys.stderr = quiet
                handlers = [handler for handler in logging.getLogger().handlers
                            if isinstance(handler, logging.StreamHandler)
                            and handler.stream is original]
                for handler in handlers:
                    handler.setStream(stream)
                try:
                    with self._noting_interrupts() if processes else contextlib.nullcontext():
                        yield
                finally:
                    for handler in handlers:
                        handler.setStream(original)
                    if sys.stderr is quiet:  # after a failed job, for good (quiet_failed_job)
                        sys.stderr = _WorkerStderr(original, self) if self.job_failed else original
        finally:
            self.interrupted = False  # the job's workers are gone: later records are heard

    @property
    def reporting(self) -> bool:
        """A failure ``fanin run`` reports in its line was seen (an unreadable input, a step's
        ``OSError``): the job is failing, and what its workers' other threads say of it
        while it stops is noise (``worker_stderr``)."""
        return self.unreadable or self.failed_step

    def reported_traceback(self, text: str) -> bool:
        """Whether a printed traceback ``text`` is of a failure ``fanin run`` reports in its
        one line: an input a worker could not read, an ``OSError`` of a step (either noted: a
        worker prints it before the runner hears of it)."""
        if UNREADABLE.search(text):
            self.unreadable = True
            return True
        if step_file_error(text) is None:
            return False
        self.failed_step = True
        return True

    def quiet_failed_job(self) -> None:
        """For the rest of a process that is ``fanin``'s own, once it said in one line why the
        job failed: what threads but the main one write to standard error or log (but Fanin's
        own records) is dropped. They are the failed job's: a portable runner's worker in this
        process (Prism's, Flink's ``LOOPBACK``) runs the bundles already sent to it until the
        process ends, and prints their failures (a second spill to a full disk; a bundle its
        runner forgot: ``KeyError: 'inst006'``) after that line."""
        self.job_failed = True


class _WorkerStderr:
    """Standard error, less a printed traceback of a failure ``fanin run`` reports
    (``reported_traceback``; and the newline ``print`` writes after it, in the same thread),
    and less what threads but the main one write once such a failure was seen or the job's
    failure was said (``reporting``, ``quiet_failed_job``), or while Ctrl-C stops a job of
    worker processes; anything else is the stream's."""

    def __init__(self, stream: TextIO, reported: ReportedFailures) -> None:
        self._stream, self._reported = stream, reported
        self._dropped = threading.local()  # .last: this thread's last write was dropped

    def write(self, text: str) -> int:
        if self._reported.interrupted:  # the stopping job's threads
            return len(text)
        if (self._reported.job_failed or self._reported.reporting) and \
                threading.current_thread() is not threading.main_thread():
            return len(text)  # the failed job's, or the failing job's threads'
        dropped = getattr(self._dropped, "last", False)
        self._dropped.last = False
        if text.startswith(_TRACEBACK) and self._reported.reported_traceback(text):
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


def step_file_error(text: str) -> str | None:
    """The message of the last line of a traceback given as text (a worker's, relayed by the
    runner, after the runner's words on Prism) when that line is an ``OSError`` of a step,
    ``"OSError: cannot write ... [while running 'STEP']"`` (the local runner's re-raise):
    ``"cannot write ... [while running 'STEP']"``, as the local runner's own worker gives it;
    else None. A last line of Beam's saying that the bundle had failed before (a split
    request to a bundle that failed: "RuntimeError: Bundle processing associated with ...
    has failed. Check prior failing response ...") stands for the failure above it."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if _TRACEBACK not in text or not lines:
        return None
    if _BUNDLE_FAILED.match(lines[-1]):
        lines = [line for line in lines[:-1] if _ERROR_LINE.fullmatch(line)] or lines
    last = _ERROR_LINE.fullmatch(lines[-1])
    return last.group(2) if last is not None and last.group(1) in OS_ERRORS else None


def worker_unreadable(text: str) -> str | None:
    """The line of an input a worker could not read (``UnreadableInput``), from a traceback
    given as text: its last report, which names the step as the local runner's does."""
    found = UNREADABLE.findall(text) if text.startswith(_TRACEBACK) else []
    return found[-1].strip() if found else None
