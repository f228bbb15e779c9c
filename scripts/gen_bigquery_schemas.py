"""Regenerate (or with --check, verify) fanin/contracts/bigquery/<kind>.json from tables.py.

Usage: python scripts/gen_bigquery_schemas.py [--check]
Exit code 1 with --check when a committed file differs from ``bigquery_schema_text(kind)``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fanin.contracts.tables import KINDS, bigquery_schema_text

FOLDER = Path(__file__).resolve().parent.parent / "fanin" / "contracts" / "bigquery"


def main(argv: list[str] | None = None) -> int:
    """Write or check every schema file; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for kind in KINDS:
        path, text = FOLDER / f"{kind}.json", bigquery_schema_text(kind)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
        else:
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"stale: {path} (run scripts/gen_bigquery_schemas.py)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
