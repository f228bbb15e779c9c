"""Helpers of the reliability tests: run ``fanin run`` on lines, read every output back (JSONL
and Parquet), and check conservation (every input message in exactly one output)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from fanin.cli import main

KINDS = ("closes", "late", "dead_letter")
Outputs = dict[str, list[dict[str, Any]]]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def run_cli(lines: list[str], folder: Path, *args: str) -> Outputs:
    """``fanin run --input <lines> --output <folder>/out ARGS`` (must exit 0); its JSONL outputs."""
    folder.mkdir(parents=True, exist_ok=True)
    traffic = write_lines(folder / "traffic.jsonl", lines)
    out = folder / "out"
    assert main(["run", "--input", str(traffic), "--output", str(out), "--overwrite", *args]) == 0
    return read_jsonl(out)


def read_jsonl(out: Path | str) -> Outputs:
    """Every JSONL output line of the run in ``out``, by kind (in file-name order)."""
    return {kind: [json.loads(line) for f in sorted(Path(out, kind).glob("*.jsonl"))
                   for line in f.read_text(encoding="utf-8").split("\n")[:-1]]
            for kind in KINDS}


def parquet_rows(out: Path | str) -> dict[str, int]:
    """Rows of the Parquet outputs of the run in ``out``, by kind."""
    return {kind: sum(pq.read_table(f).num_rows for f in Path(out, kind).rglob("*.parquet"))
            for kind in KINDS}


def summary(outputs: Outputs) -> list[tuple[str, str | None, str]]:
    """What a run decided, without times or details: (kind, join_id or a dead letter's raw
    line, reason or error)."""
    return sorted((kind, obj.get("raw") if kind == "dead_letter" else obj.get("join_id"),
                   obj.get("reason") or obj.get("error"))
                  for kind in KINDS for obj in outputs[kind])


def accounted(outputs: Outputs) -> int:
    """Input messages the outputs account for: those counted by closes, plus one per late or
    dead-letter line."""
    return (sum(c["counts"]["messages"] for c in outputs["closes"])
            + len(outputs["late"]) + len(outputs["dead_letter"]))


def messages(lines: list[str]) -> int:
    """Input messages among ``lines`` (blank lines are separators)."""
    return sum(1 for line in lines if line.strip("\r\n"))
