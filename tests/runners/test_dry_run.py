"""The dry run builds the real job offline, checks it and writes its graph."""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import socket
from pathlib import Path

import apache_beam as beam
import pytest

from fanin.cli import main as fanin_main
from fanin.pipelines.pipeline import ConfigError, RunConfig, build
from fanin.runners import DryRunError, dataflow, dry_run, maybe_dry_run

EXAMPLES = Path(__file__).resolve().parents[2] / "fanin" / "examples"
IMAGE = "us-docker.pkg.dev/fanin-dry-run/fanin/fanin:2.77.0"
SUBSCRIPTION = "projects/fanin-dry-run/subscriptions/fanin-in"


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt (metadata server, GCS, Dataflow API) fails the test."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the dry run tried to reach the network: {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def _config(streaming: bool = False, **overrides: object) -> RunConfig:
    source = ({"subscription": SUBSCRIPTION} if streaming
              else {"inputs": [str(EXAMPLES / "triage.jsonl")]})
    return RunConfig(output="gs://fanin-dry-run-bucket/out",
                     contracts_path=str(EXAMPLES / "contracts.yaml"), **{**source, **overrides})


def _dataflow_args(streaming: bool, **kwargs: object) -> list[str]:
    return dataflow("fanin-dry-run", "us-central1", "gs://fanin-dry-run-bucket/tmp",
                    streaming=streaming, sdk_container_image=IMAGE, **kwargs)


def test_dataflow_bounded_dry_run_writes_graph_and_job(tmp_path: Path) -> None:
    out = tmp_path / "graph.json"
    report = dry_run(_config(), _dataflow_args(False), str(out))
    assert report.ok, report.problems
    assert report.runner == "DataflowRunner" and not report.streaming and report.dataflow_job
    assert report.pickled >= 5
    assert "Join/GroupByJoin: StrUtf8Coder" in report.key_coders
    # no MergeDeadLetters: a bounded write spills each step's dead letters where made
    assert {"Read", "Parse", "Join", "Write/closes", "Write/late",
            "Write/dead_letter"} == set(report.transform_names)
    graph = json.loads(out.read_text())
    assert graph["runner"] == "DataflowRunner" and graph["problems"] == []
    assert graph["pipeline"]["components"]["transforms"]
    job = graph["dataflow_job"]
    assert job["type"] == "JOB_TYPE_BATCH"
    assert job["environment"]["workerPools"][0]["workerHarnessContainerImage"] == IMAGE
    assert job["environment"]["sdkPipelineOptions"]["options"]["project"] == "fanin-dry-run"


def test_dataflow_streaming_dry_run_checks_the_stateful_join(tmp_path: Path) -> None:
    report = dry_run(_config(streaming=True), _dataflow_args(True, exactly_once=False),
                     str(tmp_path / "g.json"))
    assert report.ok, report.problems
    assert report.streaming
    stateful = "Join/StatefulJoin/ParDo(JoinDoFn)"
    assert f"{stateful}: StrUtf8Coder" in report.key_coders
    assert {f"{stateful} key=StrUtf8Coder", f"{stateful} state=msgs bag FastPrimitivesCoder",
            f"{stateful} state=meta read_modify_write FastPrimitivesCoder",
            f"{stateful} timer=ts-decide EVENT_TIME", f"{stateful} timer=ts-expire EVENT_TIME",
            } <= set(report.transform_names)
    job = json.loads((tmp_path / "g.json").read_text())["dataflow_job"]
    assert job["type"] == "JOB_TYPE_STREAMING"
    assert "streaming_mode_at_least_once" in job["environment"]["serviceOptions"]


def test_update_is_checked_without_the_job_lookup(tmp_path: Path) -> None:
    args = _dataflow_args(True, job_name="fanin-prod", update=True,
                          transform_name_mapping={"Join/OldJoin": "Join/Renamed"})
    report = dry_run(_config(streaming=True), args, str(tmp_path / "g.json"))
    assert any(s.startswith("--update") for s in report.skipped)
    assert report.problems == ("--transform_name_mapping maps 'Join/OldJoin' to "
                               "'Join/Renamed', which is not a transform of the new graph",)
    # the file shows the options as given, though the job request is built without them
    options = json.loads((tmp_path / "g.json").read_text())["options"]
    assert (options["update"], options["transform_name_mapping"]) == \
        (True, {"Join/OldJoin": "Join/Renamed"})


def test_local_runner_dry_run_has_no_job(tmp_path: Path) -> None:
    report = dry_run(_config(), [], str(tmp_path / "g.json"))
    assert report.ok and report.runner == "FnApiRunner" and not report.dataflow_job
    assert json.loads((tmp_path / "g.json").read_text())["dataflow_job"] is None


class _Fragile(beam.DoFn):
    """Pickles when the ParDo is made (Beam checks then), not once ``broken`` is set."""

    broken = False

    def __reduce__(self):
        if self.broken:
            raise TypeError("fragile state")
        return (_Fragile, ())

    def process(self, element):
        yield element


def test_problems_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def build_with_flaws(p: beam.Pipeline, config: RunConfig, catalog: object) -> None:
        outputs = build(p, config, catalog)
        outputs["closes"] | "AnyKeys" >> beam.GroupByKey()
        if broken:
            pardo = beam.ParDo(_Fragile())
            outputs["late"] | "Fragile" >> pardo
            pardo.fn.broken = True

    monkeypatch.setattr(importlib.import_module("fanin.runners.dry_run"), "build",
                        build_with_flaws)
    args = argparse.Namespace(dry_run=str(tmp_path / "g.json"))
    broken = False
    assert maybe_dry_run(args, _config(), []) == 1
    report = dry_run(_config(), [], str(tmp_path / "g.json"))
    assert report.problems[0].startswith("AnyKeys: key coder FastPrimitivesCoder")
    assert "not deterministic" in report.problems[0]
    broken = True
    report = dry_run(_config(), [], str(tmp_path / "g.json"))
    assert report.problems[0].startswith("Fragile: _Fragile does not pickle: fragile state")
    assert json.loads((tmp_path / "g.json").read_text())["pipeline"] is None


def test_a_fn_beam_cannot_pickle_stops_the_dry_run(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def build_with_lambda(p: beam.Pipeline, config: RunConfig, catalog: object) -> None:
        gen = (i for i in ())  # generators do not pickle
        build(p, config, catalog)["closes"] | beam.Map(lambda x: (gen, x))

    monkeypatch.setattr(importlib.import_module("fanin.runners.dry_run"), "build",
                        build_with_lambda)
    with pytest.raises(DryRunError, match="Unable to pickle fn"):
        dry_run(_config(), [], str(tmp_path / "g.json"))


def test_maybe_dry_run_without_the_option_does_nothing(tmp_path: Path) -> None:
    assert maybe_dry_run(argparse.Namespace(dry_run=None), _config(), []) is None


@pytest.mark.parametrize("args, config, message", [
    (["--runner=DataflowRunner", "--project=fanin-dry-run",
      "--temp_location=gs://fanin-dry-run-bucket/t"], {}, "--region"),
    (["--runner=DataflowRunner", "--project=fanin-dry-run", "--region=us-central1",
      "--temp_location=gs://b/t"], {}, "bucket"),
    ([*dataflow("fanin-dry-run", "us-central1", "gs://fanin-dry-run-bucket/t", streaming=False),
      "--requirements_file=requirements.txt"], {}, "pip download"),
    ([], {"inputs": ["gs://fanin-dry-run-bucket/in/*.jsonl"]}, "local copy"),
    # Beam's stager fetched it: credential retries and tracebacks for minutes
    ([*dataflow("fanin-dry-run", "us-central1", "gs://fanin-dry-run-bucket/t", streaming=False),
      "--extra_package=gs://fanin-dry-run-bucket/pkgs/fanin-0.1.0-py3-none-any.whl"], {},
     "--extra_package gs://fanin-dry-run-bucket/pkgs/fanin-0.1.0-py3-none-any.whl: Beam's "
     "stager fetches it while staging"),
    # Beam went to the network for a default bucket, then a traceback after minutes
    (["--runner=DataflowRunner", "--project=fanin-dry-run", "--region=us-central1",
      "--temp_location=gs://fanin-dry-run-bucket"], {}, "temp_location must be a folder in a "
     "bucket"),
])
def test_what_needs_the_network_is_refused(tmp_path: Path, args: list[str],
                                           config: dict[str, object], message: str) -> None:
    """Refused before anything is built: by the job's checks (``ConfigError``) or the dry
    run's own (``DryRunError``), both one line."""
    (tmp_path / "requirements.txt").write_text("")
    args = [a.replace("=requirements.txt", f"={tmp_path / 'requirements.txt'}") for a in args]
    with pytest.raises((ConfigError, DryRunError), match=message):
        dry_run(_config(**config), args, str(tmp_path / "g.json"))
    assert not (tmp_path / "g.json").exists()


def _bad_use(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``fanin ARGV`` in-process; check exit 2 with one stderr line; return that line."""
    try:
        code = fanin_main(argv)
    except SystemExit as exited:
        code = exited.code
    captured = capsys.readouterr()
    assert code == 2, captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize("given, named", [
    ("afile/x", "afile is a file, not a folder"),
    ("afile/x/y.json", "afile is a file, not a folder"),
    ("", "--dry-run '': give a file name"),
    ("folder", "is a folder"),
    ("folder/", "give a file name"),
    ("gs://fanin-dry-run-bucket/g.json", "give a local file"),
    # the run's own output folder: the run after it was refused (it "already holds outputs")
    ("out/closes/g.json", "out/closes, an output folder (the next run would refuse it"),
])
def test_a_dry_run_file_that_cannot_be_written_is_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        given: str, named: str) -> None:
    (tmp_path / "afile").write_text("keep\n")
    (tmp_path / "folder").mkdir()
    work = tmp_path / "folder" / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    path = given if not given or "://" in given else f"{tmp_path}/{given}"
    line = _bad_use(["run", "--input", str(EXAMPLES / "triage.jsonl"), "--contracts",
                     str(EXAMPLES / "contracts.yaml"), "--output", str(tmp_path / "out"),
                     "--dry-run", path], capsys)
    assert line.startswith(f"fanin: error: --dry-run {path!r}" if not path or path.endswith("/")
                           else f"fanin: error: --dry-run {path}:")
    assert named in line
    assert ".tmp" not in line
    assert (tmp_path / "afile").read_text() == "keep\n"
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "afile", "folder", "folder/work"]


def test_a_failed_write_is_a_dry_run_error_and_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(src: str, dst: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    out = tmp_path / "graphs" / "g.json"
    with pytest.raises(DryRunError, match=f"--dry-run {out}: cannot write it: No space left"):
        dry_run(_config(), [], str(out))
    assert [p.name for p in tmp_path.rglob("*")] == ["graphs"]  # made, but empty
