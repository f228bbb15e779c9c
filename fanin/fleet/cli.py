"""The ``fanin simulate`` subcommand (registered by the main CLI through ``add_subcommand``).

Guarantees:
- ``fanin simulate --joins N --out FILE [--seed S] [--showcase] [--<rate> P ...]`` writes the
  simulation (see ``fanin.fleet.simulate``) to FILE, prints one summary line (to stdout, or to
  stderr when FILE is ``-``, standard output) and exits 0.
- ``--start now|INSTANT`` (RFC 3339) shifts every time of the run so the first join opens
  then (default: the fixed ``EPOCH``, so the same seed gives the same bytes).
- ``--rate N/s`` writes in real time: N joins open per second from now, and each line is
  written (and flushed) when the clock reaches its arrival time, so event times follow the
  clock: ``fanin simulate --joins 300 --rate 10/s --out - | fanin publish --topic T -`` is a
  live stream. Stragglers (``--delayed``) arrive up to an hour after their event; ``--delayed
  0`` ends the stream soon after the last join. Ctrl-C stops it (exit 130).
- Every ``SimRates`` field is an option (``changed_duplicate`` -> ``--changed-duplicate``).
- Bad use is one ``error:`` line on stderr and exit code 2, and nothing is written: a
  ``--joins`` outside [0, ``MAX_JOINS``] (a million: about 1.7 GB of lines, one join id per
  join held in memory, and join ids are numbered with six digits; for more, run several seeds,
  whose ids differ), a ``--seed`` of more than ``SEED_DIGITS`` digits (it is in every id), a
  probability outside [0, 1], a ``--start`` that is not ``now`` or RFC 3339, a
  ``--rate`` that is not ``N`` or ``N/s`` with N in [``MIN_JOINS_PER_S``, inf) (one join a day:
  slower rates wait longer than the clock can sleep), ``--rate`` with a ``--start`` other than
  ``now``, an empty FILE, or a FILE that cannot be opened for writing (a folder, a path under a
  file, a folder that does not exist, no permission), ``-`` when standard output is closed.
  An error while writing (disk full, a
  closed pipe) prints one line on stderr and returns 1; Ctrl-C, one line and 130. Either way
  (but with ``--rate``, whose lines were written as they came due) a FILE that is itself a
  regular file (not a link to one) is removed: what was written of it would pass for a whole
  simulation, or end in a line cut short.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
import time
from dataclasses import fields, replace
from typing import Any, TextIO

from fanin.contracts.shown import visible
from fanin.contracts.timefmt import parse_rfc3339
from fanin.fleet.simulate import (
    EPOCH,
    SHOWCASE_RATES,
    PastYear9999,
    SimRates,
    SimSummary,
    check_probability,
    write_lines,
    write_paced,
)

__all__ = ["MAX_JOINS", "MIN_JOINS_PER_S", "add_subcommand", "count_arg", "run_simulate"]

MAX_JOINS = 1_000_000
"""Most ``--joins`` of one run (about 1.7 GB of lines; for more, run several seeds)."""
MIN_JOINS_PER_S = 1 / 86_400
"""Slowest ``--rate``: one join a day (the wait between joins must stay sleepable)."""


_USAGE = ("fanin simulate --joins N --out FILE|- [--seed S] [--start now|INSTANT] "
          "[--rate N/s] [--showcase] [--<rate> P ...]")


def _start(text: str) -> str | int:
    if text == "now":
        return text
    try:
        parse_rfc3339(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not 'now' or an RFC 3339 instant: {text!r} "
                                         f"({exc})") from None
    return text


def _joins_per_s(text: str) -> float:
    number = text[:-2] if text.endswith("/s") else text
    try:
        value = float(number)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"not a positive rate like 20/s: {text!r}")
    if value < MIN_JOINS_PER_S:
        raise argparse.ArgumentTypeError(f"{text!r} is slower than one join a day "
                                         f"({MIN_JOINS_PER_S:.3g}/s), the slowest rate")
    return value


SEED_DIGITS = 100  # a join id "sim<seed>-<index>" stays far below 256 characters


def _integer(text: str) -> int:
    """``text`` as an integer, else ``argparse.ArgumentTypeError``."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def count_arg(text: str) -> int:
    """An integer >= 0 (an ``argparse`` type)."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {value}")
    return value


def _seed(text: str) -> int:
    """An integer of at most ``SEED_DIGITS`` digits (it is in every join id and message id,
    which hold at most 256 characters)."""
    value = _integer(text)
    if len(str(abs(value))) > SEED_DIGITS:
        raise argparse.ArgumentTypeError(f"must have at most {SEED_DIGITS} digits")
    return value


def _join_count(text: str) -> int:
    value = count_arg(text)
    if value > MAX_JOINS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_JOINS} (run several seeds for "
                                         f"more), not {text}")
    return value


def _out(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("give a file name, or '-' for standard output")
    return text


def _probability(name: str) -> Any:
    def parse(text: str) -> float:
        try:
            return check_probability(name, float(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "probability"  # argparse names the type in its messages
    return parse


def _write(args: argparse.Namespace, out: TextIO, rates: SimRates) -> SimSummary:
    if args.rate is not None:
        return write_paced(out, args.joins, args.seed, rates, joins_per_s=args.rate)
    start = int(time.time() * 1000) if args.start == "now" else args.start
    return write_lines(out, args.joins, args.seed, rates, start=start)


def _discard(args: argparse.Namespace, opened: os.stat_result | None) -> None:
    """Remove the part of ``--out`` written before a failure or Ctrl-C (its last line cut,
    or all lines whole: it would look complete): only when ``--out`` names, itself (not
    through a link: ``/dev/stdout`` is one), the regular file this run ``opened``; never a
    pipe or a device, and not the traffic of ``--rate``, whose lines were written as they
    came due."""
    if args.rate is not None or opened is None or not stat.S_ISREG(opened.st_mode):
        return
    with contextlib.suppress(OSError):
        named = os.lstat(args.out)
        if (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino):
            os.remove(args.out)


def run_simulate(args: argparse.Namespace) -> int:
    """Run the subcommand for parsed ``args``; returns the exit code."""
    if args.rate is not None and args.start not in (None, "now"):
        print(f"fanin simulate: error: --rate starts now; it cannot be combined with "
              f"--start {visible(args.start)}", file=sys.stderr)
        return 2
    args.start = args.start or EPOCH
    overrides = {spec.name: getattr(args, spec.name) for spec in fields(SimRates)
                 if getattr(args, spec.name) is not None}
    rates = replace(SHOWCASE_RATES if args.showcase else SimRates(), **overrides)
    if args.out == "-" and sys.stdout is None:  # started with it closed: Python holds None
        print("fanin simulate: error: standard output is closed: give --out FILE",
              file=sys.stderr)
        return 2
    try:
        out = sys.stdout if args.out == "-" else \
            open(args.out, "w", encoding="utf-8", newline="\n")  # noqa: SIM115
    except OSError as exc:  # a folder, a path under a file, ...: bad use
        print(f"fanin simulate: error: cannot write --out {visible(args.out)}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 2
    opened = None if out is sys.stdout else os.fstat(out.fileno())
    try:
        with contextlib.nullcontext() if out is sys.stdout else out:
            summary = _write(args, out, rates)
    except OSError as exc:
        _discard(args, opened)
        print(f"fanin simulate: cannot write {visible(args.out)}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    except PastYear9999 as exc:  # --start too late for this many joins: bad use
        _discard(args, opened)
        print(f"fanin simulate: error: --start {visible(args.start)}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _discard(args, opened)
        print("fanin simulate: interrupted", file=sys.stderr)
        return 130
    print(f"fanin simulate: wrote {visible(args.out)}: {summary.one_line()}",
          file=sys.stderr if args.out == "-" else sys.stdout)
    return 0


def add_subcommand(subparsers: Any) -> None:
    """Register ``simulate`` on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "simulate", usage=_USAGE,
        help="write deterministic fleet traffic (opens and receipts) as JSONL",
        description="Write a deterministic simulation of many concurrent fan-out joins "
                    "(arrival order, with duplicates, retries, conflicts, late and malformed "
                    "lines) as newline-delimited JSON.")
    parser.add_argument("--joins", type=_join_count, required=True, metavar="N",
                        help=f"number of joins to simulate (0 to {MAX_JOINS})")
    parser.add_argument("--out", type=_out, required=True, metavar="FILE",
                        help="output JSONL file ('-': standard output)")
    parser.add_argument("--seed", type=_seed, default=0, metavar="S",
                        help="random seed (same seed, same bytes; default 0; at most "
                             f"{SEED_DIGITS} digits)")
    parser.add_argument("--start", type=_start, default=None, metavar="now|INSTANT",
                        help=f"when the first join opens (default {EPOCH}; 'now' with --rate)")
    parser.add_argument("--rate", type=_joins_per_s, default=None, metavar="N/s",
                        help="write in real time: N joins open per second from now (at least "
                             "one a day), each line written when its arrival time comes "
                             "(event times follow the clock)")
    parser.add_argument("--showcase", action="store_true",
                        help="start from the raised SHOWCASE_RATES (every behaviour in a few "
                             "dozen joins) instead of the defaults")
    rates = parser.add_argument_group("rates", "probabilities in [0, 1]; override the preset")
    for spec in fields(SimRates):
        rates.add_argument(f"--{spec.name.replace('_', '-')}", dest=spec.name,
                           type=_probability(spec.name), default=None, metavar="P",
                           help=f"{spec.metadata['help']} (default {spec.default})")
    parser.set_defaults(func=run_simulate)
