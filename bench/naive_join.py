"""The fan-in join a user would write by hand in Beam, as a whole program (the performance peer).

``ReadFromText -> FlatMap(json.loads; keep dicts with a string join_id, drop the rest) ->
GroupByKey -> Map(fold) -> json.dumps -> WriteToText``, on the default local runner.

The fold: the open's ``required`` (or its contract's, from ``--contracts``); per branch the
first receipt; a changed duplicate (same branch, other content) or a key written with another
value is a conflict; complete if every required branch has an ``ok`` receipt and there is no
conflict. No validation, no dead letters, no late output, no deadlines, one output.

Usage: ``python bench/naive_join.py --input FILE --output PREFIX [--contracts FILE]``.
``bench/pipeline.py`` (part ``headline``) times it as a whole process against ``fanin run``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import yaml
from apache_beam.options.pipeline_options import PipelineOptions


def keyed(line: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(join_id, message)`` of a JSON object line with a string ``join_id``; else nothing."""
    try:
        message = json.loads(line)
    except ValueError:
        return
    if isinstance(message, dict) and isinstance(message.get("join_id"), str):
        yield message["join_id"], message


def fold(element: tuple[str, Iterable[dict[str, Any]]],
         contracts: dict[str, list[str]]) -> dict[str, Any]:
    """One join's result: first receipt per branch, conflicts, completeness."""
    join_id, messages = element
    required: list[str] = []
    first: dict[str, dict[str, Any]] = {}
    values: dict[str, Any] = {}
    conflicts: list[str] = []
    for message in messages:
        if message.get("kind") == "open":
            contract = message.get("contract")
            required = message.get("required") or (
                contracts.get(contract, []) if isinstance(contract, str) else [])
            continue
        branch = message.get("branch")
        if not isinstance(branch, str):
            continue
        seen = first.get(branch)
        if seen is not None:
            if seen != message:
                conflicts.append(f"changed duplicate: {branch}")
            continue
        first[branch] = message
        if message.get("status") != "ok":
            continue
        key = message.get("key") or branch
        if not isinstance(key, str):
            continue
        value = message.get("value")
        if key in values and values[key] != value:
            conflicts.append(f"key {key} written with another value")
        values.setdefault(key, value)
    accepted = {b for b, m in first.items() if m.get("status") == "ok"}
    complete = bool(required) and set(map(str, required)) <= accepted and not conflicts
    return {"join_id": join_id, "complete": complete, "values": values,
            "conflicts": conflicts, "messages": len(first)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="hand-written Beam fan-in join (benchmark)")
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True, help="output file prefix")
    parser.add_argument("--contracts", help="YAML contracts: required branches by name")
    args, beam_args = parser.parse_known_args(argv)
    contracts: dict[str, list[str]] = {}
    if args.contracts:
        with open(args.contracts, encoding="utf-8") as handle:
            for contract in yaml.safe_load(handle)["contracts"]:
                contracts[contract["name"]] = list(contract.get("required", []))
    with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
        (p
         | "Read" >> beam.io.ReadFromText(args.input)
         | "Parse" >> beam.FlatMap(keyed)
         | "Group" >> beam.GroupByKey()
         | "Fold" >> beam.Map(fold, contracts)
         | "Dump" >> beam.Map(json.dumps)
         | "Write" >> beam.io.WriteToText(args.output, ".jsonl"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
