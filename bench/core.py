"""Benchmark: the reducer core vs the naive reducer, and the parse path.

Usage: ``python bench/core.py [--receipts 100000] [--repeats 5]``

For each fan-out width, both reducers apply the same pre-parsed records (opens included in the
time; the rate counts receipts only) and answer "complete?" after every message, as the eager
trigger does. Runs alternate core/naive inside one process so noise hits both alike; the
table shows medians and the ratio of medians. Parse: bytes -> validated record, messages/s.

The pre-built input records are moved out of the garbage collector's view (``gc.freeze``)
before timing, so that neither reducer pays for the collector rescanning the benchmark's own
input; objects the reducers create are collected as usual.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from naive import NaiveJoin
from workloads import join_lines, join_records

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog
from fanin.contracts.parsing import parse_message
from fanin.core.reducer import JoinReducer


def _apply(records: list[R.Record], factory: Callable[[], object]) -> float:
    start = time.perf_counter()
    joins: dict[str, object] = {}
    get = joins.get
    for record in records:
        join = get(record[R.JOIN_ID])
        if join is None:
            join = joins[record[R.JOIN_ID]] = factory()
        join.add(record)  # type: ignore[attr-defined]
        join.complete()  # type: ignore[attr-defined]
    return time.perf_counter() - start


def _parse(lines: list[bytes], contracts: frozenset[str]) -> float:
    start = time.perf_counter()
    source = {"kind": "bench"}
    for line in lines:
        parse_message(line, source, contracts)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receipts", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    catalog = Catalog()
    print(f"{'width':>5} {'receipts':>9} {'core rec/s':>12} {'naive rec/s':>12} {'ratio':>6}")
    for width in (5, 50):
        lines = join_lines(args.receipts, width)
        records = join_records(lines, catalog)
        receipts = sum(1 for r in records if r[R.KIND] == R.RECEIPT)
        gc.collect()
        gc.freeze()
        core, naive = [], []
        for _ in range(args.repeats):
            core.append(_apply(records, lambda: JoinReducer(catalog)))
            naive.append(_apply(records, NaiveJoin))
        gc.unfreeze()
        core_rate = receipts / statistics.median(core)
        naive_rate = receipts / statistics.median(naive)
        print(f"{width:>5} {receipts:>9} {core_rate:>12,.0f} {naive_rate:>12,.0f} "
              f"{core_rate / naive_rate:>6.2f}")
    lines_b = [line.encode() for line in join_lines(args.receipts, 5)]
    times = [_parse(lines_b, frozenset()) for _ in range(args.repeats)]
    print(f"parse: {len(lines_b) / statistics.median(times):,.0f} messages/s "
          f"({len(lines_b)} messages, median of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
