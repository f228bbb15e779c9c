"""The README's SDK examples run and their joins complete through the real pipeline."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fanin.pipelines.pipeline import RunConfig, run_pipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("script", ["fanout_plain.py", "fanout_graph.py"])
def test_example_fan_out_completes_with_the_untaken_route_pruned(script: str,
                                                                 tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(script[:-3], EXAMPLES / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    traffic = tmp_path / "traffic.jsonl"
    module.main(str(traffic))
    run_pipeline(RunConfig(output=str(tmp_path / "out"), inputs=[str(traffic)]), [])
    closes = [json.loads(line) for f in (tmp_path / "out" / "closes").glob("*.jsonl")
              for line in f.read_text().splitlines()]
    assert len(closes) == 2
    assert {c["reason"] for c in closes} == {"complete"}
    assert sorted(tuple(c["pruned"]) for c in closes) == [("review/legal",), ("review/tech",)]
