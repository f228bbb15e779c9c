"""Helpers of the runner parity suite: run ``fanin run`` on a runner, read its outputs as
multisets of JSON objects, and count the input messages conservation must account for."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from fanin.cli import main
from fanin.contracts.catalog import load_contracts
from fanin.contracts.parsing import DEFAULT_MAX_BYTES
from fanin.transforms.read import numbered_lines
from fanin.transforms.replay import MessageScan, by_event_time, covering_disorder_s
from tests.reliability.runs import KINDS, accounted, read_jsonl

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "fanin" / "examples" / "contracts.yaml"
# The local runners every other runner is compared with, per mode.
REFERENCE = {"bounded": ("--runner=FnApiRunner",),
             "replay": ("--runner=BundleBasedDirectRunner", "--streaming")}
# Replays close by watermark: an eager close depends on the order a key's messages are
# processed in, which Beam leaves to the runner (docs/runners.md).
MODE_ARGS = {"bounded": (), "replay": ("--replay", "--close-trigger", "watermark")}
FLINK_LOCAL = ("--runner=FlinkRunner", "--flink_master=[local]", "--environment_type=LOOPBACK",
               "--parallelism=2")

Multisets = dict[str, Counter[str]]


def run_fanin(files: list[str], out: Path, mode: str, *runner: str) -> Multisets:
    """``fanin run`` over ``files`` in ``mode`` with ``runner`` (and any other) options (must
    exit 0); checks conservation and returns each output kind as a multiset of canonical JSON
    objects."""
    args = ["run", *[a for f in files for a in ("--input", f)], "--contracts", str(CONTRACTS),
            "--output", str(out), "--overwrite", *MODE_ARGS[mode], *runner]
    assert main(args) == 0, args
    outputs = read_jsonl(out)
    assert accounted(outputs) == input_messages(files), "conservation"
    return {kind: Counter(json.dumps(obj, sort_keys=True) for obj in outputs[kind])
            for kind in KINDS}


def on_time_disorder_s(files: list[str]) -> float:
    """The smallest whole ``--max-disorder-s`` with which a replay of ``files`` (in the order
    it reads them: each file's own, merged by event time) delivers no message behind the
    watermark."""
    scan = MessageScan(frozenset(load_contracts(str(CONTRACTS))), DEFAULT_MAX_BYTES)
    return covering_disorder_s(by_event_time([numbered_lines(path) for path in files], scan),
                               scan)


def input_messages(files: list[str]) -> int:
    """Messages Fanin reads from ``files``."""
    return sum(1 for path in files for _ in numbered_lines(path))


def differences(expected: Multisets, got: Multisets) -> dict[str, tuple[int, int]]:
    """Per kind with a difference: (objects only expected, objects only got)."""
    return {kind: (sum((expected[kind] - got[kind]).values()),
                   sum((got[kind] - expected[kind]).values()))
            for kind in KINDS if expected[kind] != got[kind]}
