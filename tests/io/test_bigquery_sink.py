"""The BigQuery sink offline: the job graph has one table write per output, rows convert."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from fanin.contracts.tables import bigquery_schema, to_bigquery_row
from fanin.fleet.simulate import CONTRACTS_PATH
from fanin.io.bigquery import WriteOutputTable, validate_dataset
from fanin.pipelines.pipeline import RunConfig, build, catalog_for, run_pipeline

EXAMPLE = Path(__file__).resolve().parents[2] / "fanin" / "examples" / "triage.jsonl"


def test_graph_writes_each_output_to_its_table(tmp_path: Path) -> None:
    config = RunConfig(output=str(tmp_path), inputs=[str(EXAMPLE)],
                       contracts_path=CONTRACTS_PATH, bigquery_dataset="my-proj:fanin")
    p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    build(p, config, catalog_for(config))
    names = {t.unique_name for t in p.to_runner_api().components.transforms.values()}
    for kind in ("closes", "late", "dead_letter"):
        assert f"BigQuery/{kind}" in names and f"BigQuery/{kind}/ToRow" in names


def test_every_output_row_converts_to_the_table_schema(tmp_path: Path) -> None:
    run_pipeline(RunConfig(output=str(tmp_path), inputs=[str(EXAMPLE)],
                           contracts_path=CONTRACTS_PATH), [])
    for kind in ("closes", "late", "dead_letter"):
        columns = {f["name"] for f in bigquery_schema(kind)}
        lines = [json.loads(line) for f in (tmp_path / kind).glob("*.jsonl")
                 for line in f.read_text().splitlines()]
        assert lines
        for obj in lines:
            row = to_bigquery_row(kind, obj)
            assert set(row) <= columns
            json.dumps(row)  # what WriteToBigQuery sends must be JSON


def test_dataset_names_are_checked() -> None:
    assert validate_dataset("my-proj:fanin") == "my-proj:fanin"
    assert validate_dataset("fanin_outputs")
    for bad in ("", "my proj:x", "proj:data-set", "a:b:c"):
        with pytest.raises(ValueError):
            WriteOutputTable(bad, "closes", False)


def test_dataflow_dry_run_with_the_bigquery_sink_finds_no_problem(tmp_path: Path) -> None:
    from fanin.runners import dry_run

    config = RunConfig(output="gs://fanin-dry-run-bucket/out", inputs=[str(EXAMPLE)],
                       contracts_path=CONTRACTS_PATH, bigquery_dataset="my-proj:fanin")
    report = dry_run(config, ["--runner=DataflowRunner", "--project=my-proj",
                              "--region=us-central1", "--temp_location=gs://my-bucket/tmp",
                              "--sdk_container_image=apache/beam_python3.11_sdk:2.77.0"],
                     str(tmp_path / "job.json"))
    assert report.problems == ()
    assert {"BigQuery/closes", "BigQuery/late", "BigQuery/dead_letter"} <= \
        set(report.transform_names)


def test_no_credentials_for_bigquery_is_one_line_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Application Default Credentials a run with ``--bigquery-dataset`` is one line,
    exit 2, before it starts (Beam retried its first BigQuery call with a traceback each, 47
    lines in 30 s, still running). The absence of credentials is injected: a CI machine on
    Google Cloud would have some."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    from fanin.cli import main

    def no_credentials(*args: object, **kwargs: object) -> None:
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_credentials)
    example = str(Path(CONTRACTS_PATH).with_name("triage.jsonl"))
    assert main(["run", "--input", example, "--contracts", CONTRACTS_PATH, "--output",
                 str(tmp_path / "out"), "--bigquery-dataset", "my-proj:fanin",
                 "--temp_location", "gs://bucket/tmp"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "fanin: error: --bigquery-dataset: no Google credentials to reach BigQuery: set up "
        "Application Default Credentials (gcloud auth application-default login, or "
        "GOOGLE_APPLICATION_CREDENTIALS)"]
    assert not (tmp_path / "out").exists()
