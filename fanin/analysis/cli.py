"""The ``fanin query`` and ``fanin report`` subcommands.

``add_subcommand(subparsers)`` registers both on an ``argparse`` subparsers object; each parser
gets ``func=callable(args) -> int``:

- ``fanin query DIR "SQL" [--format table|csv|json] [--out FILE]``: runs one read-only statement
  over the views ``closes``, ``late``, ``dead_letter``; prints the result, or writes it to
  exactly ``FILE`` (``-``: standard output). The result is UTF-8 wherever it goes, whatever
  the locale's encoding (``PYTHONIOENCODING``), so JSON and CSV are never re-spelled.
- ``fanin report DIR [--html FILE]``: prints a summary and optionally writes the HTML report
  (``--html -``: the HTML on standard output, the summary on standard error).

A folder a run is still writing, or one whose run stopped before its end
(``fanin.io.output_lock``), gets one warning line on stderr first; the command runs on.

Exit codes: 0 success; 2 for a missing DIR, bad or refused SQL, malformed output files, an
unwritable FILE, a result beyond 1,000,000 rows or half the machine's memory, reported as one
line on stderr (``fanin <cmd>: error: ...``), no traceback; 1 (one line) when the reader of
the output went away (a broken pipe: ``| head``); 130 for Ctrl-C (one line; it
stops ``fanin query``'s running statement; ``fanin report``'s fixed statements run to their
end first).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TextIO

import duckdb

from fanin.analysis.query import FORMATS, outside_outputs, run_query, visible
from fanin.analysis.report import build_report, report_html, summary_text, write_html
from fanin.io.credentials import require_google_credentials
from fanin.io.output_lock import state_warning

__all__ = ["add_subcommand", "cmd_query", "cmd_report"]

_USER_ERRORS = (OSError, ValueError, duckdb.Error)


def _guarded(name: str, body: Callable[[argparse.Namespace], None]) -> Callable[..., int]:
    def run(args: argparse.Namespace) -> int:
        try:
            warning = state_warning(args.dir)
            if warning is not None:  # a folder a run is writing, or one it left unfinished
                print(f"fanin {name}: warning: {warning}", file=sys.stderr)
            body(args)
        except BrokenPipeError:  # its reader went away (``| head``): not bad use
            print(f"fanin {name}: cannot write its output: Broken pipe", file=sys.stderr)
            return 1
        except _USER_ERRORS as exc:
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            # the first line, control characters shown (a message may quote a value)
            print(f"fanin {name}: error: {visible(lines[0])}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"fanin {name}: interrupted", file=sys.stderr)
            return 130
        return 0

    run.__name__ = f"cmd_{name}"
    run.__doc__ = f"Run ``fanin {name}``; 0 on success, 2 (one stderr line) on a user error."
    return run


def _reachable(option: str, path: str | None) -> None:
    """A ``gs://`` FILE needs Google credentials: without them the write retried for minutes
    with tracebacks; ``ValueError`` (one line) instead, before anything runs."""
    if path is not None and path.startswith("gs://"):
        require_google_credentials(f"{option} {path}", "Cloud Storage")


def _stdout(instead: str) -> TextIO:
    """Standard output; ``ValueError`` (one line, before any work) when the process has none
    (started with it closed: Python then holds None)."""
    if sys.stdout is None:
        raise ValueError(f"standard output is closed: {instead}")
    return sys.stdout


def _write_utf8(out: TextIO, text: str) -> None:
    """``text`` on ``out`` as UTF-8 bytes, whatever encoding the stream was opened with (a
    stream without bytes underneath, such as a ``StringIO``, takes the text). All of it, or
    ``BrokenPipeError`` when the reader goes away part-way (a write to a pipe that a signal,
    the reader's end closing, cuts short returns what it wrote, and the rest was dropped
    with exit 0)."""
    buffer = getattr(out, "buffer", None)
    if buffer is None:
        out.write(text)
        return
    out.flush()
    view = memoryview(text.encode("utf-8"))
    while view:
        view = view[buffer.write(view):]
    buffer.flush()


def _query(args: argparse.Namespace) -> None:
    to_stdout = args.out in (None, "-")
    _reachable("--out", args.out)
    out = _stdout("give --out FILE") if to_stdout else None
    text = run_query(args.dir, args.sql, args.format, None if to_stdout else args.out)
    if out is not None:
        _write_utf8(out, text)


def _report(args: argparse.Namespace) -> None:
    html_to_stdout = args.html == "-"
    _reachable("--html", args.html)
    out = _stdout("nowhere to print the " + ("HTML" if html_to_stdout else "summary"))
    if args.html is not None and not html_to_stdout and "://" not in args.html:
        outside_outputs(args.dir, args.html, "--html")
    report = build_report(args.dir)
    if html_to_stdout:
        _write_utf8(out, report_html(report))
        if sys.stderr is not None:
            sys.stderr.write(summary_text(report))
        return
    if args.html is not None:
        write_html(report, args.html)
    out.write(summary_text(report))
    if args.html is not None:
        print(f"wrote {args.html}")


cmd_query = _guarded("query", _query)
cmd_report = _guarded("report", _report)


def add_subcommand(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``query`` and ``report`` on ``subparsers`` (from ``add_subparsers()``)."""
    query = subparsers.add_parser(
        "query", help="run read-only SQL over an output folder",
        description="Views: closes, late, dead_letter (Parquet where present, else JSONL).",
    )
    query.add_argument("dir", metavar="DIR", help="the pipeline's --output folder")
    query.add_argument("sql", metavar="SQL", help="one SELECT (or EXPLAIN) statement")
    query.add_argument("--format", choices=FORMATS, default="table", help="output format")
    query.add_argument("--out", metavar="FILE",
                       help="write the result to FILE instead of stdout (-: stdout)")
    query.set_defaults(func=cmd_query)

    report = subparsers.add_parser("report", help="summarise an output folder")
    report.add_argument("dir", metavar="DIR", help="the pipeline's --output folder")
    report.add_argument("--html", metavar="FILE",
                        help="also write a self-contained HTML report (-: to stdout, the "
                             "summary then to stderr)")
    report.set_defaults(func=cmd_report)
