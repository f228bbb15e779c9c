"""Input of many joins open at once (docs/performance.md, round 25): ``rr-N``.

N joins of contract ``w`` (required ``b0``...``b<width-1>``, ``deadline_s`` 3600, eager): their
N opens 1 ms apart, then the receipt of ``b0`` of every join, then of ``b1``, ...: N * (width +
1) lines, 1 ms apart, each join open from its first line to nearly the last. Writes
``rr-N.jsonl`` and ``rr-contracts.yaml`` into ``--out`` and prints the two commands compared::

    python bench/open_joins.py --joins 40000 --out /tmp/rr
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fanin.contracts.timefmt import format_ms, parse_rfc3339

T0 = parse_rfc3339("2023-11-14T22:13:20Z")


def write_open_joins(out: Path, joins: int, width: int = 6) -> tuple[Path, Path]:
    """Write the input and its contracts file into ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    contracts = out / "rr-contracts.yaml"
    branches = ", ".join(f"b{r}" for r in range(width))
    contracts.write_text(f"contracts:\n  - name: w\n    required: [{branches}]\n"
                         "    deadline_s: 3600\n", encoding="utf-8")
    path = out / f"rr-{joins}.jsonl"
    t = T0
    with path.open("w", encoding="utf-8") as handle:
        for j in range(joins):
            handle.write(json.dumps({"kind": "open", "join_id": f"j{j}", "contract": "w",
                                     "opened_at": format_ms(t)}) + "\n")
            t += 1
        for r in range(width):
            for j in range(joins):
                handle.write(json.dumps({"join_id": f"j{j}", "branch": f"b{r}", "status": "ok",
                                         "value": r, "event_time": format_ms(t)}) + "\n")
                t += 1
    return path, contracts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--joins", type=int, default=40_000)
    parser.add_argument("--width", type=int, default=6, help="required branches per join")
    parser.add_argument("--out", type=Path, required=True, help="folder to write into")
    args = parser.parse_args(argv)
    path, contracts = write_open_joins(args.out, args.joins, args.width)
    run = f"fanin run --input {path} --contracts {contracts} --overwrite"
    print(f"{run} --output {args.out / 'bounded'}")
    print(f"{run} --output {args.out / 'replay'} --replay")
    return 0


if __name__ == "__main__":
    sys.exit(main())
