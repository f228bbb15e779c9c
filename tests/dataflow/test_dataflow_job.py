"""What a submitted Dataflow job would hit, checked offline: streaming BigQuery, packaging of
Fanin for the workers, ``--replay``."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.io.gcp.bigquery import BigQueryWriteFn
from apache_beam.io.gcp.bigquery_tools import RetryStrategy
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import PipelineVisitor
from support.dataflow_jobs import EXAMPLES, dataflow_args, example_config, unpackaged_args

from fanin import cli
from fanin.contracts.tables import bigquery_schema, to_bigquery_row
from fanin.pipelines import dataflow_checks
from fanin.pipelines.pipeline import ConfigError, RunConfig, build, catalog_for, run_pipeline
from fanin.runners import dry_run

KINDS = ("closes", "late", "dead_letter")
DATASET = "fanin-dry-run:fanin"
_RFC3339_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")


class _WriteFns(PipelineVisitor):
    """The ``BigQueryWriteFn`` (streaming inserts) of each BigQuery write, by full label."""

    def __init__(self) -> None:
        self.found: dict[str, BigQueryWriteFn] = {}

    def visit_transform(self, node: Any) -> None:
        fn = getattr(node.transform, "fn", None)
        if isinstance(fn, BigQueryWriteFn):
            self.found[node.full_label] = fn


def test_streaming_bigquery_dry_run_builds_streaming_inserts(tmp_path: Path) -> None:
    """Defect 1: Beam 2.77 has no ``STORAGE_API_AT_LEAST_ONCE``; the old code died with an
    AttributeError while building any streaming job with ``--bigquery-dataset``."""
    out = tmp_path / "graph.json"
    report = dry_run(example_config(True, bigquery_dataset=DATASET), dataflow_args(True),
                     str(out))
    assert report.ok, report.problems
    assert report.dataflow_job and report.streaming
    names = {t["uniqueName"] for t in
             json.loads(out.read_text())["pipeline"]["components"]["transforms"].values()}
    for kind in KINDS:
        assert (f"BigQuery/{kind}/Write/_StreamToBigQuery/StreamInsertRows/"
                "ParDo(BigQueryWriteFn)") in names
        # retries re-send the ids committed by this shuffle: BigQuery drops the repeats
        assert f"BigQuery/{kind}/Write/_StreamToBigQuery/CommitInsertIds" in names


def test_streaming_writes_retry_transient_errors_only() -> None:
    config = example_config(True, bigquery_dataset=DATASET)
    p = beam.Pipeline(options=PipelineOptions(["--runner=BundleBasedDirectRunner",
                                               "--streaming"]))
    build(p, config, catalog_for(config))
    fns = _WriteFns()
    p.visit(fns)
    assert sorted(fns.found) == [
        f"BigQuery/{kind}/Write/_StreamToBigQuery/StreamInsertRows/ParDo(BigQueryWriteFn)"
        for kind in sorted(KINDS)]
    for label, fn in fns.found.items():
        assert fn._retry_strategy == RetryStrategy.RETRY_ON_TRANSIENT_ERROR, label
        assert not fn.ignore_insert_ids, label  # insert ids are what makes retries dedupe


def _conforms(fields: list[dict[str, Any]], row: dict[str, Any], where: str) -> None:
    """``row`` has exactly the schema's columns, each of its type and mode (insertAll JSON)."""
    assert set(row) == {f["name"] for f in fields}, where
    for field in fields:
        value, name = row[field["name"]], f"{where}.{field['name']}"
        if field["mode"] == "REPEATED":
            assert isinstance(value, list), name
            values = value
        else:
            assert value is not None or field["mode"] == "NULLABLE", name
            values = [] if value is None else [value]
        for item in values:
            if field["type"] == "RECORD":
                _conforms(field["fields"], item, name)
            elif field["type"] == "TIMESTAMP":
                assert isinstance(item, str) and _RFC3339_MS.match(item), (name, item)
            elif field["type"] == "INTEGER":
                assert isinstance(item, int) and not isinstance(item, bool), (name, item)
            else:
                assert isinstance(item, str), (name, item)


def test_every_streaming_output_converts_to_an_insert_row(tmp_path: Path) -> None:
    """The streaming outputs (the replay of the example), every kind, as the rows
    ``tabledata.insertAll`` receives: schema columns and types, strict JSON."""
    run_pipeline(RunConfig(output=str(tmp_path), inputs=[str(EXAMPLES / "triage.jsonl")],
                           contracts_path=str(EXAMPLES / "contracts.yaml"), replay=True), [])
    for kind in KINDS:
        objs = [json.loads(line) for f in sorted((tmp_path / kind).glob("*.jsonl"))
                for line in f.read_text().splitlines()]
        assert objs, kind
        for i, obj in enumerate(objs):
            row = to_bigquery_row(kind, obj)
            _conforms(bigquery_schema(kind), row, f"{kind}[{i}]")
            json.dumps(row, allow_nan=False)  # BigQuery's JSON has no NaN/Infinity


def test_a_job_that_ships_no_fanin_gets_the_checkouts_setup_file(tmp_path: Path) -> None:
    """Defect 2: without --setup_file or --sdk_container_image the stock workers cannot import
    fanin; run from a checkout, its setup.py is added (and staged)."""
    out = tmp_path / "graph.json"
    report = dry_run(example_config(True), unpackaged_args(True), str(out))
    assert report.ok, report.problems
    graph = json.loads(out.read_text())
    setup_file = dataflow_checks.checkout_setup_file()
    assert setup_file is not None and Path(setup_file).parent / "fanin" == \
        Path(dataflow_checks.__file__).parents[1]
    assert graph["options"]["setup_file"] == setup_file
    # the sdist Beam builds from it is staged as workflow.tar.gz
    assert "workflow.tar.gz" in json.dumps(graph["dataflow_job"]["environment"])


def test_an_installed_fanin_without_packaging_is_refused(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """Defect 2, installed copy (no checkout to build from): one line, exit 2, for the dry run
    and for a real submission alike; nothing is written."""
    monkeypatch.setattr(dataflow_checks, "checkout_setup_file", lambda: None)
    with pytest.raises(ConfigError, match="the workers need Fanin"):
        dry_run(example_config(False), unpackaged_args(False), str(tmp_path / "g.json"))
    base = ["run", "--input", str(EXAMPLES / "triage.jsonl"), "--output", "gs://fanin-dry-run-bucket/o",
            *unpackaged_args(False)]
    for extra in (["--dry-run", str(tmp_path / "g.json")], []):
        assert cli.main(base + extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("fanin: error: DataflowRunner: the "
                                                        "workers need Fanin")
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("dry", [True, False])
def test_replay_is_refused_on_dataflow(tmp_path: Path, dry: bool,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Defect 3: --replay would embed every input line in the job as a TestStream."""
    argv = ["run", "--input", str(EXAMPLES / "triage.jsonl"), "--replay",
            "--output", "gs://fanin-dry-run-bucket/o", *dataflow_args(True)]
    if dry:
        argv += ["--dry-run", str(tmp_path / "g.json")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("fanin: error: --replay embeds the input in the job as a TestStream")
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize(("option", "file", "said"), [
    ("--setup_file", "missing/setup.py", "--setup_file: no such file: {path}"),
    ("--setup_file", "other.py",
     "--setup_file: give Fanin's setup.py (Beam builds a pyproject.toml only with the build "
     "module and Fanin's build requirements installed here), not {path}"),
    ("--setup_file", "pyproject.toml",
     "--setup_file: give Fanin's setup.py (Beam builds a pyproject.toml only with the build "
     "module and Fanin's build requirements installed here), not {path}"),
    ("--requirements_file", "missing.txt", "--requirements_file: no such file: {path}"),
    ("--extra_package", "missing/fanin-0.1.0-py3-none-any.whl",
     "--extra_package: no such file: {path}"),
    ("--extra_package", "fanin.txt", "--extra_package: {path} is not a package file (Beam takes "
     ".tar, .tar.gz, .whl, .zip)"),
])
@pytest.mark.parametrize("dry", [True, False])
def test_files_staged_for_the_workers_are_checked_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, file: str, said: str,
        dry: bool) -> None:
    """A staged file that is missing or of a kind Beam's stager refuses is one line and exit 2,
    before anything is built (Beam's stager raised a traceback once the graph was built)."""
    path = tmp_path / file
    if not file.startswith("missing"):
        path.write_text("")
    argv = ["run", "--input", str(EXAMPLES / "triage.jsonl"), "--output", "gs://fanin-dry-run-bucket/o",
            *unpackaged_args(False), f"{option}={path}",
            *(["--dry-run", str(tmp_path / "g.json")] if dry else [])]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"fanin: error: {said.format(path=path)}\n"
    assert not (tmp_path / "g.json").exists()


def test_a_fanin_package_reaches_the_workers_with_extra_package(tmp_path: Path) -> None:
    """An installed Fanin (no checkout) ships itself as --extra_package: the job is not
    refused, and the package is staged for the workers."""
    wheel = tmp_path / "fanin-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: staged as it is
    out = tmp_path / "graph.json"
    report = dry_run(example_config(False),
                     [*unpackaged_args(False), f"--extra_package={wheel}"], str(out))
    assert report.ok, report.problems
    assert wheel.name in json.dumps(json.loads(out.read_text())["dataflow_job"]["environment"])


@pytest.mark.parametrize(("project", "found"), [('name = "fanin"', True),
                                                 ('name = "someotherpkg"', False), (None, False)])
def test_only_fanins_own_setup_file_is_added(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             project: str | None, found: bool) -> None:
    """A ``setup.py`` beside an installed copy (site-packages) is not Fanin's unless a
    ``pyproject.toml`` beside it names the project ``fanin``: staging another one would
    build some other project's sdist for the workers."""
    module = tmp_path / "fanin" / "pipelines" / "dataflow_checks.py"
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    if project is not None:
        (tmp_path / "pyproject.toml").write_text(f"[project]\n{project}\nversion = \"1\"\n")
    monkeypatch.setattr(dataflow_checks, "__file__", str(module))
    assert dataflow_checks.checkout_setup_file() == (str(tmp_path / "setup.py") if found else None)


@pytest.mark.parametrize(("extra", "said"), [
    (["--output", "/tmp/local-out"], "--output /tmp/local-out: a Dataflow job writes where its "
     "workers can, a gs:// path"),
    (["--output", "s3://my-bucket/out"], "--output s3://my-bucket/out: a Dataflow job writes "
     "where its workers can, a gs:// path"),
    (["--output", "gs://B/out"], "--output bucket must be a valid bucket name (3-63 "
     "characters, or up to 222 with dots: a-z, 0-9, -, _, .; not starting with goog, not "
     "containing google, not an IP address), got 'B'"),
    # each went on with the job (a bucket Cloud Storage refuses), or, for a location with no
    # folder, to the network with tracebacks, also in a dry run
    *[(["--output", f"gs://{bucket}/out"], "--output bucket must be a valid bucket name (3-63 "
       "characters, or up to 222 with dots: a-z, 0-9, -, _, .; not starting with goog, not "
       f"containing google, not an IP address), got '{bucket}'")
      for bucket in ("goog-bucket", "my-google-bucket", "192.168.1.1", "bucket..x")],
    (["--temp_location=gs://fanin-dry-run-bucket"], "temp_location must be a folder in a "
     "bucket, gs://BUCKET/PATH, got 'gs://fanin-dry-run-bucket'"),
    (["--region=us_central1"], "region must be a region such as us-central1, got 'us_central1'"),
    (["--temp_location=/tmp/x"], "temp_location must be a gs:// path, got '/tmp/x'"),
    (["--max_num_workers", "0"], "Pipeline has validations errors: Invalid value (0) for option: "
     "max_num_workers. Value needs to be positive."),
    (["--job_name=fanin", "--update"], "--update replaces a running streaming job; a bounded "
     "job is run anew"),
    (['--transform_name_mapping={"a": "b"}'], "--transform_name_mapping applies to an --update "
     "only"),
    (["--streaming", "--job_name=fanin", "--update", '--transform_name_mapping=["a"]'],
     "--transform_name_mapping must be a JSON object of old transform name -> new name"),
    (["--dataflow_service_options=streaming_mode_at_least_once"],
     "--dataflow_service_options=streaming_mode_at_least_once applies to streaming jobs only"),
])
@pytest.mark.parametrize("dry", [True, False])
def test_a_dataflow_job_is_checked_before_it_is_built(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], said: str,
        dry: bool) -> None:
    """Where a Dataflow job runs and what it replaces: one line, exit 2, for a real submission
    as for the dry run (a real run with a bad location went to the network and ended in
    tracebacks; Beam's own validation printed its header without the reason; a mapping that
    is not an object was a traceback; a bounded --update and a local --output passed)."""
    options = [a for a in dataflow_args(False) if not a.startswith(("--region", "--temp_loc"))]
    location = [a for a in dataflow_args(False) if a.startswith(("--region", "--temp_loc"))]
    argv = ["run", "--input", str(EXAMPLES / "triage.jsonl"), "--output",
            "gs://fanin-dry-run-bucket/o", *options,
            *[a for a in location if not any(a.split("=")[0] == e.split("=")[0] for e in extra)],
            *extra, *(["--dry-run", str(tmp_path / "g.json")] if dry else [])]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"fanin: error: {said}\n"
    assert not (tmp_path / "g.json").exists()


@pytest.mark.parametrize("alias", ["dataflow", "dataflowrunner", "Dataflow"])
def test_beams_other_names_of_dataflow_get_the_same_checks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], alias: str) -> None:
    """``--runner dataflow`` is Beam's Dataflow runner too: the same offline checks (a local
    --output refused in one line) and the same dry run (they were skipped: the dry run went to
    the network for credentials and printed tracebacks)."""
    options = [f"--runner={alias}" if a == "--runner=DataflowRunner" else a
               for a in dataflow_args(False)]
    assert f"--runner={alias}" in options
    argv = ["run", "--input", str(EXAMPLES / "triage.jsonl"), *options]
    assert cli.main([*argv, "--output", "/tmp/local-out", "--dry-run",
                     str(tmp_path / "g.json")]) == 2
    assert capsys.readouterr().err == ("fanin: error: --output /tmp/local-out: a Dataflow job "
                                       "writes where its workers can, a gs:// path\n")
    assert cli.main([*argv, "--output", "gs://fanin-dry-run-bucket/o", "--dry-run",
                     str(tmp_path / "g.json")]) == 0
    assert json.loads((tmp_path / "g.json").read_text())["dataflow_job"]["type"] == \
        "JOB_TYPE_BATCH"


class _RunningJob:
    """What ``Pipeline.run`` gives for a Dataflow job (none can run here): waiting for it is
    interrupted by Ctrl-C; ``cancel`` is recorded (a real one cancels the job by the API)."""

    def __init__(self) -> None:
        self.cancelled = False

    def wait_until_finish(self) -> None:
        raise KeyboardInterrupt

    def cancel(self) -> None:
        self.cancelled = True


def test_ctrl_c_while_waiting_leaves_a_bounded_dataflow_job_running(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/runners.md: "Ctrl-C then leaves that job running". It cancelled the job (by the
    Dataflow API) and said "interrupted before it wrote anything"."""
    import fanin.pipelines.pipeline as pipeline

    job = _RunningJob()
    monkeypatch.setattr(beam.Pipeline, "run", lambda self, *args, **kwargs: job)
    monkeypatch.setattr(pipeline, "expand_inputs", list)  # gs:// needs Cloud Storage
    assert cli.main(["run", "--input", "gs://fanin-dry-run-bucket/in/*.jsonl", "--output",
                     "gs://fanin-dry-run-bucket/o", *dataflow_args(False)]) == 130
    assert not job.cancelled
    assert capsys.readouterr().err.splitlines()[-1] == (
        "fanin: interrupted: the Dataflow job runs on (stop it with gcloud dataflow jobs "
        "cancel or drain)")


def test_a_local_input_is_refused_for_a_dataflow_job_but_not_its_dry_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The job was submitted: its workers, which cannot see this machine's files, were to
    read it. The dry run reads a local copy while it builds the graph."""
    local = str(EXAMPLES / "triage.jsonl")
    argv = ["run", "--input", local, "--output", "gs://fanin-dry-run-bucket/o",
            *dataflow_args(False)]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == (
        f"fanin: error: --input {local}: a Dataflow job's workers read its input: give a "
        "gs:// path (--dry-run takes a local copy)\n")
    assert cli.main([*argv, "--dry-run", str(tmp_path / "g.json")]) == 0


@pytest.mark.parametrize("dataflow", [True, False])
def test_beams_streaming_flag_on_files_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], dataflow: bool) -> None:
    """Dataflow took it as a streaming job with a bounded graph (its streaming checks, --update
    included, passed); the local runner was handed the bounded graph in streaming mode."""
    where = (["--output", "gs://fanin-dry-run-bucket/o", *dataflow_args(False)] if dataflow
             else ["--output", str(tmp_path / "o")])
    assert cli.main(["run", "--input", str(EXAMPLES / "triage.jsonl"), *where, "--streaming",
                     "--dry-run", str(tmp_path / "g.json")]) == 2
    assert capsys.readouterr().err == (
        "fanin: error: --streaming: files are read as bounded input; a stream reads Pub/Sub "
        "(--subscription, --topic) or replays a file (--replay)\n")
    assert not (tmp_path / "g.json").exists()


def test_a_dataflow_dry_run_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beam's stager left a folder (the pickled session, the job's dependencies list; with a
    setup file the sdist) in the system's temporary folder on every dry run."""
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    assert cli.main(["run", "--input", str(EXAMPLES / "triage.jsonl"), "--output",
                     "gs://fanin-dry-run-bucket/o", *dataflow_args(False), "--dry-run",
                     str(tmp_path / "g.json")]) == 0
    assert json.loads((tmp_path / "g.json").read_text())["dataflow_job"]["type"] == \
        "JOB_TYPE_BATCH"
    assert os.listdir(system_tmp) == []
