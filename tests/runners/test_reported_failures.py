"""``fanin.runners.reported_failures``: an input a worker could not read is reported once, by
``fanin run``, not again in the runner's logs and the worker's printed traceback."""

from __future__ import annotations

import io
import logging
import sys
import threading
from collections.abc import Callable

import pytest

from fanin.io.inputs import UnreadableInput
from fanin.runners.reported_failures import ReportedFailures

_RELAYED = ("bundle inst001 stage-001 failed:Traceback (most recent call last):\n  File ...\n"
            "fanin.io.inputs.UnreadableInput: input /d/a.jsonl.gz cannot be decompressed after "
            "line 3 (the file is cut short) (EOFError: ...)")


def _in_thread(action: Callable[[], object]) -> int:
    """Run ``action`` in a thread of its own, to its end; the thread's ident."""
    thread = threading.Thread(target=action)
    thread.start()
    thread.join()
    assert thread.ident is not None
    return thread.ident


def _record(message: str, name: str, level: int = logging.ERROR,
            error: BaseException | None = None) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, (),
                             (type(error), error, None) if error else None)


def test_a_relayed_traceback_drops_it_and_the_runner_s_later_records() -> None:
    """Prism relays the worker's traceback as text in its own logger, the job client logs it
    at the root: both are dropped, and so is whatever another logger says after them (the
    failed job, the job server's shutdown). Fanin's own records always pass."""
    reported = ReportedFailures()
    before = _record("Really starting service at localhost:1", "apache_beam.utils."
                     "subprocess_server", logging.WARNING)
    assert reported.filter(before) and reported.filter(_record("ready", "PrismRunner"))
    assert not reported.filter(_record(_RELAYED, "PrismRunner"))
    assert not reported.filter(_record("job failed", "PrismRunner"))
    assert not reported.filter(_record("Really destroying service at localhost:1",
                                       "apache_beam.utils.subprocess_server", logging.WARNING))
    assert reported.filter(_record("runner PrismRunner, bounded input", "fanin", logging.INFO))
    assert reported.filter(_record("x", "fanin.transforms.write", logging.WARNING))


def test_other_loggers_are_heard_after_an_unreadable_input() -> None:
    """Only Prism's relay and the job servers' processes are silenced after an unreadable
    input: a runner that retries the work (Dataflow relays a worker's error, then goes on)
    still logs what follows, and a later library warning is kept (it dropped every logger's
    records for the rest of the process)."""
    reported = ReportedFailures()
    assert not reported.filter(_record("Error: " + _RELAYED + " (will be retried)",
                                       "apache_beam.runners.dataflow.dataflow_runner"))
    assert reported.filter(_record("Workflow failed: out of memory in stage F12",
                                   "apache_beam.runners.dataflow.dataflow_runner"))
    assert reported.filter(_record("token refresh failed", "google.auth", logging.WARNING))
    assert reported.filter(_record("quota exceeded", "root", logging.WARNING))


def test_an_unreadable_input_logged_as_an_exception_is_dropped() -> None:
    reported = ReportedFailures()
    error = UnreadableInput("input a.gz cannot be decompressed after line 1")
    assert not reported.filter(_record("Error processing instruction", "apache_beam.runners."
                                       "worker.sdk_worker", error=error))
    assert reported.unreadable


def test_other_records_pass() -> None:
    """A runner's failure that is not an unreadable input is the runner's to log."""
    reported = ReportedFailures()
    assert reported.filter(_record("job failed: OutOfMemoryError in stage-2", "PrismRunner"))
    assert reported.filter(_record("Retry with exponential backoff", "apache_beam.utils.retry",
                                   logging.WARNING))
    assert not reported.unreadable


def test_a_new_run_s_filter_replaces_the_earlier_one(caplog: pytest.LogCaptureFixture) -> None:
    """Each run installs its own filter: an earlier run's unreadable input does not silence
    a later run's logs (``main`` called twice in one process)."""
    handler = logging.getLogger().handlers[0]
    first = ReportedFailures.install()
    first.unreadable = True
    second = ReportedFailures.install()
    ours = [f for f in handler.filters if isinstance(f, ReportedFailures)]
    try:
        assert ours == [second] and not second.unreadable
    finally:
        handler.removeFilter(second)


def test_the_worker_s_printed_traceback_is_dropped_with_its_newline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Beam's SDK worker ``print``s the traceback of a failed bundle to standard error before
    logging it: that print (and the newline ``print`` adds) is dropped when it names an
    unreadable input; anything else written passes, unchanged."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    reported = ReportedFailures()
    with reported.worker_stderr():
        print("Traceback (most recent call last):\n  File ...\nValueError: other",
              file=sys.stderr)
        print("progress", file=sys.stderr)
        print(_RELAYED.split(":", 1)[1], file=sys.stderr)
        print("after", file=sys.stderr)
        assert sys.stderr.isatty() is False  # the rest of the stream is the stream's
    assert sys.stderr is stream
    assert stream.getvalue() == ("Traceback (most recent call last):\n  File ...\n"
                                 "ValueError: other\nprogress\nafter\n")
    assert reported.unreadable


def test_a_record_whose_arguments_do_not_fit_is_left_to_the_handler() -> None:
    """A library's log call with arguments its message cannot take: the filter decides on
    the message as written (the handler then reports the logging error, as without it)."""
    reported = ReportedFailures()
    bad = logging.LogRecord("grpc", logging.WARNING, __file__, 1, "%d channels", ("x",), None)
    assert reported.filter(bad)
    relayed = logging.LogRecord("PrismRunner", logging.ERROR, __file__, 1, _RELAYED + " %d",
                                ("x",), None)
    assert not reported.filter(relayed)


def test_a_newline_of_another_thread_is_not_taken_for_the_traceback_s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The newline ``print`` writes after the dropped traceback is dropped in the thread that
    printed it only; another thread's lone newline written in between is kept (the main
    thread's: other threads are quiet once the failure is seen)."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with ReportedFailures().worker_stderr():
        _in_thread(lambda: sys.stderr.write(_RELAYED.split(":", 1)[1]))
        sys.stderr.write("\n")
        sys.stderr.write("next\n")
    assert stream.getvalue() == "\nnext\n"  # (it was "next\n": the other's newline taken)


_STEP_FAILURE = ("Traceback (most recent call last):\n  File \"fanin/io/files.py\", line 76\n"
                 "OSError: cannot write 'o/closes/.x.tmp-lines': File too large\n\n"
                 "During handling of the above exception, another exception occurred:\n\n"
                 "Traceback (most recent call last):\n  File \"sdk_worker.py\", line 310\n"
                 "OSError: cannot write 'o/closes/.x.tmp-lines': File too large "
                 "[while running 'Write/closes/SpillBundles']\n")


def test_a_worker_s_traceback_as_text_gives_the_local_runner_s_line() -> None:
    """With ``--direct_num_workers 2`` the local runner fails the job with its worker's
    traceback as the text of a RuntimeError: the line is the one its own worker gives (the
    step's OSError, the unreadable input's last report, which names the step)."""
    from fanin.runners.reported_failures import step_file_error, worker_unreadable
    from fanin.runners.toolchain import runner_failure

    assert step_file_error(_STEP_FAILURE) == \
        "cannot write 'o/closes/.x.tmp-lines': File too large [while running " \
        "'Write/closes/SpillBundles']"
    assert runner_failure(RuntimeError(_STEP_FAILURE), []) == (
        "the job failed reading or writing files: " + step_file_error(_STEP_FAILURE), 1)
    cut = _RELAYED.split("failed:", 1)[1]
    assert worker_unreadable(f"{cut}\n\nDuring handling ...\n\nTraceback (most recent call "
                             f"last):\n{cut.splitlines()[-1]} [while running 'Read/Lines']\n") \
        == f"{cut.splitlines()[-1].split(': ', 1)[1]} [while running 'Read/Lines']"
    assert runner_failure(RuntimeError(cut), [])[1] == 2  # type: ignore[index]
    other = _STEP_FAILURE.replace("OSError", "KeyError")
    assert step_file_error(other) is None and runner_failure(RuntimeError(other), []) is None
    assert step_file_error(_STEP_FAILURE.replace(" [while running", " [in")) is None


def test_a_worker_s_relayed_record_of_a_step_s_file_failure_is_dropped() -> None:
    """The local runner logs its worker processes' records as one line, their newlines
    escaped (``Worker: severity: ERROR ... message: "...\\nOSError: ..."``)."""
    relayed = ("Worker: severity: ERROR message: \"cannot write \\'o/x\\': File too large "
               "[while running \\'Write/closes/SpillBundles\\']\\nTraceback (most recent call "
               "last):\\n  File ...\\nOSError: cannot write \\'o/x\\': File too large\"")
    reported = ReportedFailures()
    name = "apache_beam.runners.portability.local_job_service"
    assert not reported.filter(_record(relayed, name))
    assert reported.filter(_record(relayed.replace("OSError", "KeyError"), name))
    assert reported.filter(_record(relayed.replace("[while running", "[in"), name))
    dataflow = ReportedFailures()  # a runner that retries the bundle: its records are heard
    assert dataflow.filter(_record(relayed.replace("OSError", "ConnectionResetError"),
                                   "apache_beam.runners.dataflow.dataflow_runner"))
    assert not dataflow.failed_step


def _filtered(text: str, reported: ReportedFailures, stopped: bool = False) -> str:
    """What ``TracebackFilter`` passes of ``text``, fed line by line, then at its end."""
    from fanin.runners.stderr_relay import TracebackFilter

    lines = TracebackFilter(reported.reported_traceback, lambda: stopped)
    out = [chunk for line in text.encode().splitlines(keepends=True)
           for chunk in lines.feed(line)]
    return b"".join([*out, *lines.flush(end=True)]).decode()


def test_worker_processes_printed_tracebacks_of_reported_failures_are_dropped() -> None:
    """The standard error of the local runner's worker processes: a printed traceback (its
    chained ones and ``print``'s blank line included) whose last exception line is a step's
    OSError or an unreadable input is dropped; every other line and traceback passes, in
    order, also one cut off by the end of the stream. A traceback not followed by a blank
    line ends at its exception line: what comes after it is judged on its own (the
    review's case: a thread's traceback, then a warning, then a worker's unreadable input;
    the warning and the thread's traceback were dropped with the worker's traceback)."""
    other = "Traceback (most recent call last):\n  File ...\nKeyError: 'x'\n\n"
    thread = ("Exception in thread run_worker:\nTraceback (most recent call last):\n  File "
              "...\nRuntimeError: Worker subprocess exited with return code -9\n")
    unreadable = _RELAYED.split("failed:", 1)[1] + " [while running 'Read/Lines']\n\n"
    reported = ReportedFailures()
    stream = ("warming up\n" + _STEP_FAILURE + "\n" + other + thread + "fanin WARNING x\n"
              + unreadable + "between\n" + "Traceback (most recent call last):\n  File ...")
    assert _filtered(stream, reported) == (
        "warming up\n" + other + thread + "fanin WARNING x\n" + "between\n"
        + "Traceback (most recent call last):\n  File ...")
    assert reported.unreadable and reported.failed_step
    assert _filtered(stream, ReportedFailures(), stopped=True) == ""


def test_a_complete_traceback_is_decided_when_nothing_follows_and_a_long_one_passes() -> None:
    """``flush(end=False)`` (nothing came for a while) decides a traceback whose exception
    line was read, and holds one still being written; one longer than ``HOLD_BYTES`` is not
    a traceback's print: it passes as it is."""
    from fanin.runners.stderr_relay import HOLD_BYTES, TracebackFilter

    lines = TracebackFilter(ReportedFailures().reported_traceback, lambda: False)
    assert lines.feed(b"Traceback (most recent call last):\n") == []
    assert lines.feed(b"  File ...\n") == [] and lines.flush(end=False) == []
    assert lines.feed(b"KeyError: 'x'\n") == []
    assert lines.flush(end=False) == [b"Traceback (most recent call last):\n",
                                      b"  File ...\n", b"KeyError: 'x'\n"]
    assert not lines.holding
    long = [b"Traceback (most recent call last):\n", *[b"  " + b"x" * 1000 + b"\n"] *
            (HOLD_BYTES // 1000 + 1)]
    assert b"".join(chunk for line in long for chunk in lines.feed(line)) == b"".join(long)


def test_worker_processes_stderr_is_relayed_and_this_process_s_own_bypasses_it(
        capfd: pytest.CaptureFixture[str]) -> None:
    """With ``multi_processing``: a child process (as the local runner starts its workers)
    writes to the file descriptor 2 it inherits: its printed traceback of a step's OSError is
    dropped, its other lines pass; this process's ``sys.stderr`` and the root logger's
    handlers write to standard error directly (they waited in the pipe behind a held
    traceback: a review saw warnings held for the job's length). Afterwards file descriptor
    2 and ``sys.stderr`` are as they were."""
    import os
    import subprocess

    child = ("import sys; sys.stderr.write('child line\\n'); sys.stderr.write(sys.argv[1]); "
             "sys.stderr.write('\\nchild after\\n'); sys.stderr.flush()")
    before = (sys.stderr, os.fstat(2).st_ino, os.fstat(2).st_dev)
    reported = ReportedFailures()
    with reported.worker_stderr(["--direct_running_mode=multi_processing"]):
        sys.stderr.write("own line\n")
        subprocess.run([sys.executable, "-c", child, _STEP_FAILURE], check=True)
    assert (sys.stderr, os.fstat(2).st_ino, os.fstat(2).st_dev) == before
    err = capfd.readouterr().err
    assert "own line\n" in err and "child line\nchild after\n" in err, err
    assert "Traceback" not in err and reported.failed_step


def test_while_ctrl_c_stops_a_job_of_worker_processes_their_noise_is_dropped(
        capfd: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C stops a job of worker processes (they share the terminal): SIGINT raises
    KeyboardInterrupt as before and marks the run interrupted; until the job's end the
    runner's records, its threads' printed exceptions and the workers' standard error are
    dropped (``fanin run`` says it in one line). Fanin's own records pass; after the job,
    everything is heard again (a host program's own records were dropped for good) and
    SIGINT's handler is Python's again."""
    import os
    import signal
    import subprocess

    reported = ReportedFailures()
    with reported.worker_stderr(["--direct_running_mode=multi_processing"]):
        sys.stderr.write("before\n")
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000_000):  # the handler runs at the next bytecode boundary
                pass
        except KeyboardInterrupt:
            pass
        assert reported.interrupted
        sys.stderr.write("Exception in thread beam_control_read:\n")
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('worker\\n')"],
                       check=True)
        assert not reported.filter(_record("Worker: severity: CRITICAL ...",
                                           "apache_beam.runners.portability.local_job_service"))
        assert reported.filter(_record("interrupted", "fanin", logging.INFO))
    assert capfd.readouterr().err == "before\n"
    assert not reported.interrupted and reported.filter(_record("later", "host.app"))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_prism_s_failed_bundle_of_a_step_s_file_failure_is_one_line() -> None:
    """On Prism a write the disk refuses was "the runner failed the job (FAILED): bundle ...
    failed:Traceback (most recent call last):" under ~160 lines: the job client's record (at
    the root) of the worker's traceback, Prism's relays of the failed bundle and job, the job
    server's shutdown. Now the local runner's line; the records are dropped."""
    from fanin.runners.toolchain import runner_failure

    failed = f"bundle inst004 stage-003 failed:{_STEP_FAILURE}"
    assert runner_failure(RuntimeError(f"Pipeline job-001 failed in state FAILED: {failed}"),
                          []) == ("the job failed reading or writing files: cannot write "
                                  "'o/closes/.x.tmp-lines': File too large [while running "
                                  "'Write/closes/SpillBundles']", 1)
    reported = ReportedFailures()
    assert reported.filter(_record("Really starting service at localhost:1",
                                   "apache_beam.utils.subprocess_server", logging.WARNING))
    assert reported.filter(_record("Bundle Failed. (", "PrismRunner"))  # not yet known
    assert not reported.filter(_record(failed, "root"))
    assert not reported.filter(_record("job failed", "PrismRunner"))
    assert not reported.filter(_record("Really destroying service at localhost:1",
                                       "apache_beam.utils.subprocess_server", logging.WARNING))
    assert reported.filter(_record("a note", "root", logging.WARNING))
    assert reported.filter(_record(failed.replace("OSError", "KeyError"), "root"))
    split = (f"split[inst004] error from SDK: RuntimeError: Original Exception: "  # a split
             f"{_STEP_FAILURE}\nThe above exception was the direct cause of the following "
             f"exception:\n\nTraceback (most recent call last):\n  File \"sdk_worker.py\"\n"
             f"RuntimeError: Bundle processing associated with inst004 has failed. Check "
             f"prior failing response and attached exception for details.\n")
    assert runner_failure(RuntimeError(f"Pipeline job-001 failed in state FAILED: {split}"),
                          [])[0].startswith(  # type: ignore[index]
        "the job failed reading or writing files: cannot write 'o/closes/.x.tmp-lines'")
    assert not ReportedFailures().filter(_record(split, "PrismRunner"))


def test_once_a_failed_job_is_said_the_job_s_threads_are_quiet(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A portable runner's worker in this process (Prism's ``LOOPBACK``) goes on with the
    bundles it was sent after the job failed, and printed their failures (or a bundle its
    runner forgot: ``KeyError: 'inst006'``) after ``fanin run``'s line (a loaded CI machine):
    in a process that is ``fanin``'s own, once the line is said, what other threads write
    or log is dropped, for good; the main thread's passes."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    reported = ReportedFailures()
    with reported.worker_stderr():
        reported.quiet_failed_job()
        print("fanin: error: the line", file=sys.stderr)
        _in_thread(lambda: print("Traceback ...\nKeyError: 'inst006'", file=sys.stderr))
    late = _in_thread(lambda: sys.stderr.write("later, from a worker\n"))
    sys.stderr.write("the main thread's\n")
    assert stream.getvalue() == "fanin: error: the line\nthe main thread's\n"
    record = _record("Failed to read inputs in the data plane.",
                     "apache_beam.runners.worker.data_plane")
    record.thread = late
    assert not reported.filter(record)
    assert reported.filter(_record("a record of the main thread", "host.app"))


def test_once_a_reported_failure_is_seen_the_worker_s_other_threads_are_quiet(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Flink tears a job down after the in-process (``LOOPBACK``) worker's bundle failed on an
    unreadable input; in about 1 run of 15 the worker's gRPC threads printed "Exception in
    thread run_worker_1-1" and logged "Failed to read inputs in the data plane" before
    ``fanin run``'s line. Once a failure Fanin reports is seen, while the job runs, what
    other threads write to standard error is dropped, and so are the records of Beam's SDK
    worker in other threads; the main thread's, Fanin's and other loggers' pass (Dataflow's
    job messages come from a thread of its own)."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    reported = ReportedFailures()
    with reported.worker_stderr():
        _in_thread(lambda: sys.stderr.write("a worker thread's words before the failure\n"))
        assert not reported.filter(_record("Error processing instruction", "apache_beam."
                                           "runners.worker.sdk_worker", error=UnreadableInput(
                                               "input a.gz cannot be decompressed")))
        ident = _in_thread(lambda: sys.stderr.write(
            "Exception in thread run_worker_1-1:\nTraceback (most recent call last):\n"
            "grpc._channel._MultiThreadedRendezvous: <... StatusCode.CANCELLED>\n"))
        sys.stderr.write("the main thread's\n")
    assert stream.getvalue() == ("a worker thread's words before the failure\n"
                                 "the main thread's\n")
    for name, heard in (("apache_beam.runners.worker.data_plane", False),
                        ("apache_beam.runners.dataflow.dataflow_runner", True),
                        ("fanin.io.inputs", True)):
        record = _record("Failed to read inputs in the data plane.", name)
        record.thread = ident
        assert reported.filter(record) is heard, name
    assert reported.filter(_record("Failed to read inputs in the data plane.",
                                   "apache_beam.runners.worker.data_plane"))
