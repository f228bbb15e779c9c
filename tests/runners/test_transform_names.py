"""The job's stable transform names (what a Dataflow update matches) do not change by accident.

Besides the names, the stateful join's key coder, state ids (with their kind and coder) and
timer ids (with their time domain) are listed: changing any of them breaks an update too.

After an intentional rename, regenerate the committed list with

    FANIN_UPDATE_TRANSFORM_NAMES=1 .venv/bin/pytest tests/runners/test_transform_names.py

and update running jobs with ``--update --transform_name_mapping='{"Old": "New"}'``
(docs/runners.md, "Update and drain").
"""

from __future__ import annotations

import os
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from fanin.pipelines.pipeline import RunConfig, build, catalog_for
from fanin.runners import stable_names

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "tests" / "data" / "transform_names.txt"
HEADER = ("# Stable transform names of the Fanin job: '<mode> <name>' per line (see\n"
          "# tests/runners/test_transform_names.py). Renaming any breaks Dataflow update "
          "compatibility.\n")


def _names(mode: str) -> list[str]:
    """``mode``: ``bounded``, ``streaming``, or ``streaming+sinks`` (BigQuery and output topics
    as well, whose transforms are matched by an update too)."""
    examples = ROOT / "fanin" / "examples"
    streaming = mode.startswith("streaming")
    source = ({"subscription": "projects/fanin-names/subscriptions/fanin-in"} if streaming
              else {"inputs": [str(examples / "triage.jsonl")]})
    sinks = {"bigquery_dataset": "fanin-names:fanin", "topics": {
        kind: f"projects/fanin-names/topics/{kind}" for kind in ("closes", "late",
                                                                 "dead_letter")}}
    config = RunConfig(output="gs://fanin-names/out", contracts_path=str(examples /
                       "contracts.yaml"), **source, **(sinks if mode.endswith("sinks") else {}))
    p = beam.Pipeline(options=PipelineOptions(
        ["--runner=BundleBasedDirectRunner", "--streaming"] if streaming
        else ["--runner=FnApiRunner"]))
    build(p, config, catalog_for(config))
    return [f"{mode} {name}" for name in stable_names(p.to_runner_api())]


def test_transform_names_match_the_committed_list() -> None:
    current = _names("bounded") + _names("streaming") + _names("streaming+sinks")
    if os.environ.get("FANIN_UPDATE_TRANSFORM_NAMES"):
        COMMITTED.write_text(HEADER + "".join(f"{line}\n" for line in current),
                             encoding="utf-8")
    committed = [line for line in COMMITTED.read_text(encoding="utf-8").splitlines()
                 if line and not line.startswith("#")]
    added = sorted(set(current) - set(committed))
    removed = sorted(set(committed) - set(current))
    assert current == committed, (
        f"transform names changed (added {added}, removed {removed}). Renaming a transform, "
        "the stateful join's DoFn class or its state/timer ids breaks Dataflow update "
        "compatibility. If the rename is intended, regenerate with "
        "`FANIN_UPDATE_TRANSFORM_NAMES=1 .venv/bin/pytest tests/runners/test_transform_names.py`"
        " and "
        "update running jobs with --update --transform_name_mapping='{\"<old>\": \"<new>\"}' "
        "(docs/runners.md, 'Update and drain').")
