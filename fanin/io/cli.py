"""The ``fanin publish`` subcommand: publish a newline-delimited file to a Pub/Sub topic.

``fanin publish --topic projects/PROJECT/topics/TOPIC [--progress-every N] [--timeout S] FILE``

- FILE ``-`` reads standard input (e.g. ``fanin simulate --rate 20/s --out - | fanin publish
  --topic ... -``). Which lines are messages: the rule of ``fanin run --input`` (see
  ``fanin.io.publish``).
- stderr: ``published K (failed F)`` after every N settled messages (default 1000; 0 turns it
  off); ``waiting for Pub/Sub ...`` once when nothing has been confirmed for 5 s; at the end,
  one line per kind of failure: ``failed: COUNT x ERROR (lines FIRST-LAST)``.
- stdout: one final summary line ``sent=N failed=M`` (also after Ctrl-C).
- ``--timeout S`` (default 60): give up after S seconds without any confirmation (Pub/Sub or
  its emulator down); the messages not confirmed and the lines not sent count as failed.
- exit status: 0 if every message was published, 1 if any failed, 130 after Ctrl-C, also while
  it waits for the last confirmations (the messages in flight get 10 s to settle; reading a
  pipe, the first Ctrl-C takes effect at the next line it reads; a second Ctrl-C stops at
  once, without a count), 2 with
  a one-line message for bad usage: a malformed topic path, a file that cannot be opened, a
  timeout that is not a positive number, no credentials (and no ``PUBSUB_EMULATOR_HOST``);
  also 2 for a compressed file damaged part of the way (one line naming the last line read,
  then ``sent=N failed=M`` of the lines before the damage, which were published).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from types import FrameType

from fanin.contracts.shown import visible
from fanin.fleet.cli import count_arg

__all__ = ["add_subcommand", "positive_seconds", "run_publish"]

INTERRUPTED = 130


def positive_seconds(text: str) -> float:
    """An ``argparse`` type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, not {text}")
    return value


def add_subcommand(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``publish`` on ``subparsers``; its ``func(args) -> int`` is ``run_publish``."""
    parser = subparsers.add_parser(
        "publish",
        help="publish a newline-delimited file to a Pub/Sub topic, one message per line",
        description=(
            "Publish every message line of FILE ('-': standard input) as one Pub/Sub message "
            "(empty lines are skipped, as by `fanin run --input`), with attributes event_time "
            "and message_id taken from JSON lines. Honours PUBSUB_EMULATOR_HOST."
        ),
    )
    parser.add_argument("--topic", required=True, help="projects/PROJECT/topics/TOPIC")
    parser.add_argument(
        "--progress-every",
        type=count_arg,
        default=1000,
        metavar="N",
        help="report progress on stderr every N messages (0: never; default 1000)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=60.0,
        metavar="S",
        help="give up after S seconds without any confirmation from Pub/Sub (default 60)",
    )
    parser.add_argument("file", metavar="FILE", help="newline-delimited input file, or -")
    parser.set_defaults(func=run_publish)


def _service() -> str:
    host = os.environ.get("PUBSUB_EMULATOR_HOST")
    return f"the Pub/Sub emulator at {host} (PUBSUB_EMULATOR_HOST)" if host else "Pub/Sub"


def _bad_use(message: str) -> int:
    """One ``fanin publish: error: ...`` line on stderr (as every subcommand says bad use);
    exit status 2."""
    print(f"fanin publish: error: {visible(message)}", file=sys.stderr)
    return 2


def run_publish(args: argparse.Namespace) -> int:  # noqa: C901 (one exit per publish outcome the CLI reports)
    """Run ``fanin publish`` for parsed ``args``; returns the exit status."""
    from google.auth.exceptions import DefaultCredentialsError

    from fanin.io.publish import publish_file
    from fanin.io.pubsub import check_emulator_host, validate_topic_path

    try:
        validate_topic_path(args.topic)
        check_emulator_host()
    except ValueError as exc:
        return _bad_use(str(exc))
    if args.file == "-" and sys.stdin is None:  # started with it closed: Python holds None
        return _bad_use("standard input is closed: give FILE")
    if args.file != "-" and not os.path.isfile(args.file):
        what = "no such file" if not os.path.exists(args.file) else \
            "a folder, not a file" if os.path.isdir(args.file) else \
            "not a regular file (a pipe or a device: give - and send it to standard input)"
        return _bad_use(f"{what}: {args.file}")
    every = args.progress_every

    def progress(sent: int, failed: int) -> None:
        if every > 0 and (sent + failed) % every == 0:
            print(f"published {sent + failed} (failed {failed})", file=sys.stderr, flush=True)

    def waiting(silent_s: float) -> None:
        print(f"fanin publish: waiting for {_service()}: nothing confirmed for "
              f"{silent_s:.0f} s; giving up after {args.timeout:g} s (--timeout)",
              file=sys.stderr, flush=True)

    stop = threading.Event()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C: at once

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, interrupt) if main else None
    try:
        summary = publish_file(args.topic, args.file, progress, timeout_s=args.timeout,
                               waiting=waiting, stop=stop)
    except OSError as exc:
        return _bad_use(f"cannot read {args.file}: {exc.strerror or exc}")
    # credentials that cannot be read, or UnreadableInput (a ValueError: a compressed file
    # not of its suffix's format, before anything is published)
    except ValueError as exc:
        return _bad_use(str(exc))
    except DefaultCredentialsError:
        return _bad_use("no Google credentials: set PUBSUB_EMULATOR_HOST=HOST:PORT to use the "
                        "Pub/Sub emulator, or set up Application Default Credentials")
    except KeyboardInterrupt:
        print("fanin publish: interrupted twice; messages in flight were not counted",
              file=sys.stderr)
        return INTERRUPTED
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    for kind in summary.kinds:
        lines = (f"line {kind.first_line}" if kind.first_line == kind.last_line
                 else f"lines {kind.first_line}-{kind.last_line}")
        print(f"failed: {kind.count} x {kind.error} ({lines})", file=sys.stderr)
    if summary.interrupted:
        print("fanin publish: interrupted; lines after the last one sent were not read",
              file=sys.stderr)
    if summary.unreadable is not None:  # the lines before the damage were sent: counted
        print(f"fanin publish: error: {visible(summary.unreadable)}", file=sys.stderr)
    print(f"sent={summary.sent} failed={summary.failed}", flush=True)
    if summary.interrupted:
        return INTERRUPTED
    return 2 if summary.unreadable is not None else 1 if summary.failed else 0
