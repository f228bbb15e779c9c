"""Beam metrics of a run: the counters agree with what the outputs hold (namespace ``fanin``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from apache_beam.metrics.metric import MetricsFilter

from fanin.fleet.simulate import CONTRACTS_PATH, write_simulation
from fanin.pipelines.pipeline import RunConfig, run_pipeline


def _lines(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl"))
            for line in f.read_text().splitlines()]


def test_bounded_run_counts_every_output_and_parsed_message(tmp_path: Path) -> None:
    traffic = tmp_path / "traffic.jsonl"
    write_simulation(traffic, joins=150, seed=5)
    out = tmp_path / "out"
    result = run_pipeline(RunConfig(output=str(out), inputs=[str(traffic)],
                                    contracts_path=CONTRACTS_PATH), [])
    found = result.metrics().query(MetricsFilter().with_namespace("fanin"))
    counters = {r.key.metric.name: r.committed for r in found["counters"]}
    closes, late, dead = (_lines(out / kind) for kind in ("closes", "late", "dead_letter"))
    expected = Counter(f"closes.{c['reason']}" for c in closes) + \
        Counter(f"late.{x['reason']}" for x in late) + \
        Counter(f"dead_letter.{x['error']}" for x in dead)
    assert {k: v for k, v in counters.items() if k != "messages.parsed"} == dict(expected)
    lines = len(traffic.read_bytes().splitlines())
    parse_errors = sum(1 for x in dead if x["source"]["kind"] == "file" and
                       x["error"] not in ("undefined_join", "join_too_large"))
    assert counters["messages.parsed"] == lines - parse_errors
    latency = {r.key.metric.name: r.committed for r in found["distributions"]}
    assert latency["close.latency_ms"].count == len(closes)
    assert latency["close.latency_ms"].sum == sum(c["latency_ms"] for c in closes)
