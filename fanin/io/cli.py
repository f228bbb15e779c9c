"""The ``fanin publish`` subcommand: publish a newline-delimited file to a Pub/Sub topic.

``fanin publish --topic projects/P/topics/T [--progress-every N] FILE``

- stderr: ``published K (failed F)`` after every N settled messages (default 1000; 0 turns it
  off), then one ``line L: ERROR`` per failed line.
- stdout: one final summary line ``sent=N failed=M``.
- exit status: 0 if every non-empty line was published, 1 if any failed, 2 with a one-line
  message for a malformed topic path or a file that cannot be opened.
"""

from __future__ import annotations

import argparse
import os
import sys

from fanin.io.pubsub import publish_file, validate_topic_path

__all__ = ["add_subcommand", "run_publish"]


def add_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """Register ``publish`` on ``subparsers``; its ``func(args) -> int`` is ``run_publish``."""
    parser = subparsers.add_parser(
        "publish",
        help="publish a newline-delimited file to a Pub/Sub topic, one message per line",
        description=(
            "Publish every non-empty line of FILE as one Pub/Sub message, with attributes "
            "event_time and message_id taken from JSON lines. Honours PUBSUB_EMULATOR_HOST."
        ),
    )
    parser.add_argument("--topic", required=True, help="projects/PROJECT/topics/TOPIC")
    parser.add_argument(
        "--progress-every",
        type=int,
        default=1000,
        metavar="N",
        help="report progress on stderr every N messages (0: never; default 1000)",
    )
    parser.add_argument("file", metavar="FILE", help="newline-delimited input file")
    parser.set_defaults(func=run_publish)


def run_publish(args: argparse.Namespace) -> int:
    """Run ``fanin publish`` for parsed ``args``; returns the exit status."""
    try:
        validate_topic_path(args.topic)
    except ValueError as exc:
        print(f"fanin publish: {exc}", file=sys.stderr)
        return 2
    if not os.path.isfile(args.file):
        print(f"fanin publish: no such file: {args.file}", file=sys.stderr)
        return 2
    every = args.progress_every

    def progress(sent: int, failed: int) -> None:
        if every > 0 and (sent + failed) % every == 0:
            print(f"published {sent + failed} (failed {failed})", file=sys.stderr)

    try:
        summary = publish_file(args.topic, args.file, progress)
    except OSError as exc:
        print(f"fanin publish: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for failure in summary.errors:
        print(f"line {failure.line}: {failure.error}", file=sys.stderr)
    print(f"sent={summary.sent} failed={summary.failed}")
    return 1 if summary.failed else 0
