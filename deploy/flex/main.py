"""Flex Template entrypoint: template parameters -> the ``fanin run`` command line.

The Flex Template launcher runs this file (``FLEX_TEMPLATE_PYTHON_PY_FILE``) with every template
parameter as ``--name=value`` plus Beam's own options (``--runner``, ``--project``,
``--region``, ``--temp_location``, ...).

Guarantees:
- The parameters are the ones ``metadata.json`` (next to this file) declares; each is turned
  into the ``fanin run`` option of the same name with ``-`` for ``_``
  (``--close_trigger=eager`` -> ``--close-trigger=eager``); booleans become
  ``--allow-partial`` / ``--no-allow-partial``; ``format=jsonl,parquet`` becomes one
  ``--format`` per value. Every other argument reaches Beam unchanged.
- The job is built and submitted by ``fanin.cli.main`` (``fanin run``), so a template
  job is exactly the job ``fanin run`` builds with the same options. The exit code is
  ``fanin run``'s.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

__all__ = ["parameter_names", "to_fanin_args"]

METADATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metadata.json")
_BOOLEANS = frozenset({"allow_partial", "fail_fast", "log_closes"})
_LISTS = frozenset({"format"})


def parameter_names(metadata_path: str = METADATA) -> frozenset[str]:
    """The template's parameter names, from ``metadata.json``."""
    with open(metadata_path, encoding="utf-8") as handle:
        return frozenset(p["name"] for p in json.load(handle)["parameters"])


def to_fanin_args(argv: Sequence[str], names: frozenset[str]) -> list[str]:
    """``fanin run`` arguments for the launcher's ``argv`` (see the module guarantees)."""
    out: list[str] = []
    for arg in argv:
        name, sep, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if name not in names or not sep:
            out.append(arg)
            continue
        option = "--" + name.replace("_", "-")
        if name in _BOOLEANS:
            if value not in ("true", "false"):
                raise SystemExit(f"fanin: error: {name} must be true or false, got {value!r}")
            out.append(option if value == "true" else "--no-" + option[2:])
        elif name in _LISTS:
            out += [f"{option}={item}" for item in value.split(",")]
        else:
            out.append(f"{option}={value}")
    return out


if __name__ == "__main__":
    from fanin.cli import main

    sys.exit(main(["run", *to_fanin_args(sys.argv[1:], parameter_names())]))
