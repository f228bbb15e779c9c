"""``fanin.runners.reported_failures``: an input a worker could not read is reported once, by
``fanin run``, not again in the runner's logs and the worker's printed traceback."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from fanin.io.inputs import UnreadableInput
from fanin.runners.reported_failures import ReportedFailures

_RELAYED = ("bundle inst001 stage-001 failed:Traceback (most recent call last):\n  File ...\n"
            "fanin.io.inputs.UnreadableInput: input /d/a.jsonl.gz cannot be decompressed after "
            "line 3 (the file is cut short) (EOFError: ...)")


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
    printed it only; another thread's lone newline written in between is kept."""
    import threading

    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    with ReportedFailures().worker_stderr():
        sys.stderr.write(_RELAYED.split(":", 1)[1])
        other = threading.Thread(target=lambda: sys.stderr.write("\n"))
        other.start()
        other.join()
        sys.stderr.write("next\n")
    assert stream.getvalue() == "\nnext\n"  # (it was "next\n": the other's newline taken)
