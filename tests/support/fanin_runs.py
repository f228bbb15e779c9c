"""Helpers for the framework integration tests: load an example module, and fold emitted lines
through the real ``fanin run`` (bounded, local runner) into closes by ``join_id``."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from fanin.cli import main as fanin_main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

Closes = dict[str, dict[str, Any]]


def load_example(name: str) -> ModuleType:
    """The module ``examples/<name>.py``, registered in ``sys.modules`` (frameworks resolve
    a state schema's annotations through its module)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def join_ids(lines: Iterable[str]) -> list[str]:
    """The ``join_id`` of every open among ``lines``, in order."""
    return [m["join_id"] for m in map(json.loads, lines) if m.get("kind") == "open"]


def jsonl_lines(path: Path) -> list[str]:
    """The lines of a JSON-lines file: split at ``\\n`` only (``str.splitlines`` also splits
    at U+2028, U+0085, ``\\x1c``..., which JSON strings may hold unescaped)."""
    return [line for line in path.read_text(encoding="utf-8").split("\n") if line]


def run_fanin(lines: list[str], folder: Path) -> Closes:
    """``fanin run`` over ``lines`` (written to ``folder``); its closes by ``join_id``.

    Asserts that nothing went to ``late/`` or ``dead_letter/``: every emitted message must be
    valid and folded into a close."""
    traffic = folder / "traffic.jsonl"
    traffic.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    out = folder / "out"
    assert fanin_main(["run", "--input", str(traffic), "--output", str(out)]) == 0
    for kind in ("late", "dead_letter"):
        assert [line for f in (out / kind).glob("*.jsonl") for line in jsonl_lines(f)] == [], \
            kind
    closes = [json.loads(line) for f in (out / "closes").glob("*.jsonl")
              for line in jsonl_lines(f)]
    return {c["join_id"]: c for c in closes}


def fold_runs(outcomes: dict[str, Any], lines: dict[str, list[str]], example: ModuleType,
              folder: Path) -> dict[str, tuple[Any, Any]]:
    """One ``fanin run`` over the lines each framework run emitted (``lines``: run name ->
    its lines, one fan-out each) and the example module's joins (``example.main(path)``):
    run name -> (its ``outcomes`` entry, its join's close); ``"example"`` -> (None, the
    closes of the example's joins)."""
    example.main(str(folder / "example.jsonl"))
    example_lines = (folder / "example.jsonl").read_text().splitlines()
    closes = run_fanin([*itertools.chain.from_iterable(lines.values()), *example_lines],
                       folder)
    result: dict[str, tuple[Any, Any]] = {}
    for name, emitted in lines.items():
        (join_id,) = join_ids(emitted)  # one fan-out per run: exactly one join
        result[name] = (outcomes[name], closes[join_id])
    result["example"] = (None, [closes[j] for j in join_ids(example_lines)])
    return result
