"""The ``fanin simulate`` subcommand (registered by the main CLI through ``add_subcommand``).

Guarantees:
- ``fanin simulate --joins N --out FILE [--seed S] [--showcase] [--<rate> P ...]`` writes the
  simulation (see ``fanin.fleet.simulate``) to FILE, prints one summary line to stdout and
  exits 0.
- Every ``SimRates`` field is an option (``changed_duplicate`` -> ``--changed-duplicate``).
- A negative ``--joins`` or a rate outside [0, 1] is a usage error: one ``error:`` line on
  stderr (after argparse's usage line) and exit code 2. An unwritable FILE prints one line on
  stderr and returns 1.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields, replace
from typing import Any

from fanin.fleet.simulate import SHOWCASE_RATES, SimRates, check_probability, write_simulation

__all__ = ["add_subcommand", "run_simulate"]


_USAGE = "fanin simulate --joins N --out FILE [--seed S] [--showcase] [--<rate> P ...]"


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {value}")
    return value


def _probability(name: str) -> Any:
    def parse(text: str) -> float:
        try:
            return check_probability(name, float(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = "probability"  # argparse names the type in its messages
    return parse


def run_simulate(args: argparse.Namespace) -> int:
    """Run the subcommand for parsed ``args``; returns the exit code."""
    overrides = {spec.name: getattr(args, spec.name) for spec in fields(SimRates)
                 if getattr(args, spec.name) is not None}
    rates = replace(SHOWCASE_RATES if args.showcase else SimRates(), **overrides)
    try:
        summary = write_simulation(args.out, args.joins, args.seed, rates)
    except OSError as exc:
        print(f"fanin simulate: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"fanin simulate: wrote {args.out}: {summary.one_line()}")
    return 0


def add_subcommand(subparsers: Any) -> None:
    """Register ``simulate`` on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "simulate", usage=_USAGE,
        help="write deterministic fleet traffic (opens and receipts) as JSONL",
        description="Write a deterministic simulation of many concurrent fan-out joins "
                    "(arrival order, with duplicates, retries, conflicts, late and malformed "
                    "lines) as newline-delimited JSON.")
    parser.add_argument("--joins", type=_non_negative_int, required=True, metavar="N",
                        help="number of joins to simulate")
    parser.add_argument("--out", required=True, metavar="FILE", help="output JSONL file")
    parser.add_argument("--seed", type=int, default=0, metavar="S",
                        help="random seed (same seed, same bytes; default 0)")
    parser.add_argument("--showcase", action="store_true",
                        help="start from the raised SHOWCASE_RATES (every behaviour in a few "
                             "dozen joins) instead of the defaults")
    rates = parser.add_argument_group("rates", "probabilities in [0, 1]; override the preset")
    for spec in fields(SimRates):
        rates.add_argument(f"--{spec.name.replace('_', '-')}", dest=spec.name,
                           type=_probability(spec.name), default=None, metavar="P",
                           help=f"{spec.metadata['help']} (default {spec.default})")
    parser.set_defaults(func=run_simulate)
