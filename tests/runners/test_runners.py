"""Runner presets produce options Beam and ``fanin run`` accept; bad input raises; the Flex
Template files agree with ``fanin run`` and the pinned Beam version."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    PortableOptions,
    SetupOptions,
    StandardOptions,
    WorkerOptions,
)

from fanin import cli
from fanin.io.pubsub import validate_pubsub_path
from fanin.runners import dataflow, default_sdk_image, direct, flink, portable, spark

ROOT = Path(__file__).resolve().parents[2]
FLEX = ROOT / "deploy" / "flex"
GCP = ("my-project", "us-central1", "gs://my-bucket/tmp")


def _forwarded(options: list[str]) -> list[str]:
    """What ``fanin run`` would refuse among ``options`` (it forwards the rest to Beam)."""
    return cli._unknown_beam_args(options)


def test_direct_bounded_and_streaming() -> None:
    assert direct(False) == ["--runner=FnApiRunner"]
    threads = PipelineOptions(direct(False, workers=4)).view_as(DirectOptions)
    assert (threads.direct_num_workers, threads.direct_running_mode) == (4, "multi_threading")
    procs = PipelineOptions(direct(False, 2, multi_process=True)).view_as(DirectOptions)
    assert procs.direct_running_mode == "multi_processing"
    streaming = PipelineOptions(direct(True)).view_as(StandardOptions)
    assert (streaming.runner, streaming.streaming) == ("BundleBasedDirectRunner", True)


def test_dataflow_streaming_defaults() -> None:
    options = PipelineOptions(dataflow(*GCP, max_workers=5, num_workers=2,
                                       machine_type="n2-standard-4",
                                       service_account="fanin@my-project.iam.gserviceaccount.com",
                                       job_name="fanin-prod"))
    cloud = options.view_as(GoogleCloudOptions)
    assert (cloud.project, cloud.region, cloud.temp_location) == GCP
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    assert options.view_as(StandardOptions).streaming
    assert not cloud.dataflow_service_options  # exactly-once is Dataflow's default
    assert cloud.service_account_email == "fanin@my-project.iam.gserviceaccount.com"
    assert cloud.job_name == "fanin-prod"
    workers = options.view_as(WorkerOptions)
    assert (workers.num_workers, workers.max_num_workers, workers.machine_type) == (
        2, 5, "n2-standard-4")
    assert options.view_as(SetupOptions).setup_file == "./setup.py"


def test_dataflow_variants() -> None:
    at_least_once = PipelineOptions(dataflow(*GCP, exactly_once=False))
    assert at_least_once.view_as(GoogleCloudOptions).dataflow_service_options == [
        "streaming_mode_at_least_once"]
    batch = PipelineOptions(dataflow(*GCP, streaming=False))
    assert not batch.view_as(StandardOptions).streaming
    image = PipelineOptions(dataflow(*GCP, sdk_container_image="europe-docker.pkg.dev/p/r/f:1"))
    assert image.view_as(SetupOptions).setup_file is None
    assert image.view_as(WorkerOptions).sdk_container_image == "europe-docker.pkg.dev/p/r/f:1"
    update = PipelineOptions(dataflow(*GCP, job_name="fanin-prod", update=True,
                                      transform_name_mapping={"Join": "Join2"}))
    cloud = update.view_as(GoogleCloudOptions)
    assert cloud.update and cloud.transform_name_mapping == {"Join": "Join2"}


def test_portable_runners() -> None:
    f = PipelineOptions(flink("flink-jm:8081", 4, "DOCKER"))
    assert f.view_as(StandardOptions).runner == "FlinkRunner"
    assert f.view_as(PortableOptions).environment_config == default_sdk_image()
    assert f.get_all_options()["parallelism"] == 4
    assert "--flink_job_server_jar=/jars/flink.jar" in flink("[local]", 1,
                                                              job_server_jar="/jars/flink.jar")
    s = PipelineOptions(spark("spark://master:7077", "EXTERNAL", "localhost:50000"))
    assert s.get_all_options()["spark_master_url"] == "spark://master:7077"
    assert s.view_as(PortableOptions).environment_type == "EXTERNAL"
    p = PipelineOptions(portable("localhost:8099"))
    assert p.view_as(PortableOptions).job_endpoint == "localhost:8099"


def test_every_preset_passes_through_fanin_run() -> None:
    presets = [direct(False, 2, True), direct(True),
               dataflow(*GCP, exactly_once=False, max_workers=3, job_name="j", update=True,
                        transform_name_mapping={"a": "b"}),
               flink("localhost:8081", 2), spark(), portable("localhost:8099", "DOCKER")]
    for options in presets:
        assert _forwarded(options) == [], options


@pytest.mark.parametrize("call, message", [
    (lambda: direct(False, workers=0), "workers"),
    (lambda: direct(False, multi_process=True), "workers >= 2"),
    (lambda: direct(True, workers=2), "one process"),
    (lambda: dataflow("123456789", "us-central1", "gs://my-bucket/t"), "project"),
    (lambda: dataflow("My_Project", "us-central1", "gs://my-bucket/t"), "project"),
    (lambda: dataflow("my-project", "us-central1-a", "gs://my-bucket/t"), "not a zone"),
    (lambda: dataflow("my-project", "central", "gs://my-bucket/t"), "region"),
    (lambda: dataflow("my-project", "us-central1", "/tmp/t"), "gs://"),
    (lambda: dataflow("my-project", "us-central1", "gs://b/t"), "bucket"),
    (lambda: dataflow(*GCP, max_workers=0), "max_workers"),
    (lambda: dataflow(*GCP, num_workers=5, max_workers=2), "<= max_workers"),
    (lambda: dataflow(*GCP, setup_file=None), "setup_file or sdk_container_image"),
    (lambda: dataflow(*GCP, setup_file="pkg/setup.py", sdk_container_image="img:1"),
     "not both"),
    (lambda: dataflow(*GCP, setup_file="requirements.txt"), "setup.py"),
    (lambda: dataflow(*GCP, setup_file="pkg/pyproject.toml"), "Fanin's setup.py"),
    (lambda: dataflow(*GCP, streaming=False, exactly_once=False), "streaming only"),
    (lambda: dataflow(*GCP, enable_streaming_engine=False), "Streaming Engine"),
    (lambda: dataflow(*GCP, update=True), "job_name"),
    (lambda: dataflow(*GCP, streaming=False, update=True, job_name="j"), "streaming"),
    (lambda: dataflow(*GCP, transform_name_mapping={"a": "b"}), "update=True"),
    (lambda: dataflow(*GCP, job_name="Bad_Name"), "job_name"),
    (lambda: dataflow(*GCP, machine_type="big one"), "machine_type"),
    (lambda: dataflow(*GCP, service_account="nobody"), "service_account"),
    (lambda: flink("localhost", 1), "master"),
    (lambda: flink("localhost:8081", 0), "parallelism"),
    (lambda: flink("localhost:8081", 1, "K8S"), "environment_type"),
    (lambda: flink("localhost:8081", 1, "PROCESS"), "environment_config"),
    (lambda: flink("localhost:8081", 1, "LOOPBACK", "x"), "LOOPBACK"),
    (lambda: spark("yarn"), "master"),
    (lambda: portable("localhost"), "job_endpoint"),
])
def test_bad_preset_input_raises(call, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


# ----------------------------------------------------------------------------- Flex Template
def _flex_main():
    spec = importlib.util.spec_from_file_location("fanin_flex_main", FLEX / "main.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLES = {
    "subscription": "projects/my-project/subscriptions/fanin-in",
    "input": "gs://my-bucket/traffic/*.jsonl",
    "output": "gs://my-bucket/fanin/",
    "contracts": "gs://my-bucket/fanin/contracts.yaml",
    "close_trigger": "watermark",
    "deadline_s": "45",
    "allow_partial": "true",
    "fail_fast": "false",
    "log_closes": "true",
    "retention_s": "604800",
    "window_s": "60",
    "shards": "2",
    "max_bytes": "262144",
    "max_messages_per_join": "1000",
    "max_bytes_per_join": "33554432",
    "format": "jsonl,parquet",
    "bigquery_dataset": "my-project:fanin",
    "closes_topic": "projects/my-project/topics/fanin-closes",
    "late_topic": "projects/my-project/topics/fanin-late",
    "dead_letter_topic": "projects/my-project/topics/fanin-dead-letter",
    "id_label": "event_id",
}
BAD = {
    "subscription": "projects/my-project/topics/t", "input": "/local/file.jsonl",
    "output": "out/", "contracts": "gs://my-bucket/c.json", "close_trigger": "eagerly",
    "deadline_s": "-1", "allow_partial": "yes", "fail_fast": "1", "log_closes": "on",
    "retention_s": "7d",
    "window_s": "a", "shards": "0", "max_bytes": "1e6", "max_messages_per_join": "-5",
    "format": "csv", "max_bytes_per_join": "16MiB", "bigquery_dataset": "my project:fanin",
    "closes_topic": "projects/p/subscriptions/s", "late_topic": "fanin-late",
    "dead_letter_topic": "projects/p/topics/", "id_label": "event id",
}


def test_flex_metadata_is_complete() -> None:
    metadata = json.loads((FLEX / "metadata.json").read_text(encoding="utf-8"))
    assert metadata["name"] and metadata["description"]
    params = metadata["parameters"]
    names = [p["name"] for p in params]
    assert len(names) == len(set(names)) and set(names) == set(EXAMPLES)
    for p in params:
        assert p["label"] and p["helpText"] and isinstance(p["isOptional"], bool), p
        assert p["regexes"], f"{p['name']} has no regex"
        for regex in p["regexes"]:
            assert re.fullmatch(regex, EXAMPLES[p["name"]]), (p["name"], regex)
            assert not re.fullmatch(regex, BAD[p["name"]]), (p["name"], regex)
    assert [p["name"] for p in params if not p["isOptional"]] == ["output"]


def test_flex_parameters_are_fanin_run_options() -> None:
    main = _flex_main()
    names = main.parameter_names()
    argv = [f"--{name}={value}" for name, value in EXAMPLES.items()]
    argv += ["--runner=DataflowRunner", "--project=my-project"]
    args, rest = cli._parser("run").parse_known_args(["run", *main.to_fanin_args(argv, names)])
    assert rest == ["--runner=DataflowRunner", "--project=my-project"]  # Beam's, forwarded
    assert (args.subscription, args.output, args.close_trigger) == (
        EXAMPLES["subscription"], EXAMPLES["output"], "watermark")
    assert (args.deadline_s, args.allow_partial, args.fail_fast) == (45.0, True, False)
    assert (args.max_messages_per_join, args.format) == (1000, ["jsonl", "parquet"])
    assert (args.max_bytes_per_join, args.bigquery_dataset, args.id_label) == (
        33554432, "my-project:fanin", "event_id")
    assert (args.closes_topic, args.late_topic, args.dead_letter_topic) == (
        EXAMPLES["closes_topic"], EXAMPLES["late_topic"], EXAMPLES["dead_letter_topic"])


def test_dockerfile_pins_the_project_beam_version() -> None:
    dockerfile = (FLEX / "Dockerfile").read_text(encoding="utf-8")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    pin = re.search(r'"apache-beam\[gcp\]==([0-9.]+)\.\*"', pyproject).group(1)
    images = re.findall(r"^FROM (\S+)", dockerfile, flags=re.MULTILINE)
    assert images[0].startswith("gcr.io/dataflow-templates-base/python311-template-launcher")
    assert images[-1] == f"apache/beam_python3.11_sdk:{pin}.0"
    assert 'FLEX_TEMPLATE_PYTHON_PY_FILE="${WORKDIR}/deploy/flex/main.py"' in dockerfile
    # the image installs Fanin: no setup file for the launcher to install again (Google's sample)
    assert "FLEX_TEMPLATE_PYTHON_SETUP_FILE=" not in dockerfile
    # the launcher image is pinned by a release tag, never floating
    tag = images[0].split(":", 1)[1].split()[0]
    assert re.fullmatch(r"[0-9]{8}_RC[0-9]{2}", tag), images[0]
    assert "/opt/google/dataflow/python_template_launcher" in dockerfile


def test_the_build_context_leaves_out_the_environment_and_keeps_what_the_image_copies() -> None:
    """``docker build -f deploy/flex/Dockerfile .`` sent .venv (~1 GB) and .git to the engine."""
    ignored = [line.strip().rstrip("/") for line in
               (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
               if line.strip() and not line.startswith("#")]
    assert {".git", ".venv"} <= set(ignored)
    dockerfile = (FLEX / "Dockerfile").read_text(encoding="utf-8")
    copied = [part for line in re.findall(r"^COPY (?!--from)(.+)$", dockerfile, re.MULTILINE)
              for part in line.split()[:-1]]
    assert "fanin" in copied and "deploy/flex" in copied
    for path in copied:
        assert (ROOT / path).exists() and not any(
            path == pattern or path.startswith(f"{pattern}/") for pattern in ignored), path


def _accepted(path: str, collection: str) -> bool:
    try:
        validate_pubsub_path(path, collection)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name", [
    "my-project/{}/fanin-closes", "example.com:my-project/{}/a.b~c", "P/{}/closes",
    "my-project/{}/goog-x", "my-project/{}/GOOGx", "my-project/{}/ab", "my-project/{}/1abc",
    "my-proj-/{}/abc", "my-project/{}/" + "a" * 256, "my-project/{}/a/b",
])
def test_flex_pubsub_regexes_accept_what_fanin_accepts(name: str) -> None:
    """A template parameter the metadata's regex accepts is one ``fanin run`` accepts, and
    the other way round (the regexes accepted names Fanin then refused at launch)."""
    metadata = json.loads((FLEX / "metadata.json").read_text(encoding="utf-8"))
    regexes = {p["name"]: p["regexes"][0] for p in metadata["parameters"]}
    for parameter, collection in (("subscription", "subscriptions"),
                                  ("closes_topic", "topics"), ("late_topic", "topics"),
                                  ("dead_letter_topic", "topics")):
        path = "projects/" + name.format(collection)
        assert bool(re.fullmatch(regexes[parameter], path)) == _accepted(path, collection), \
            (parameter, path)


@pytest.mark.parametrize(("name", "accepted", "refused"), [
    ("deadline_s", ["1", "0.5", "30"], ["0", "0.0", "-1"]),
    ("window_s", ["1", "60", "86400"], ["0", "86401", "90000", "1.5"]),
    ("shards", ["1", "1000"], ["0", "1001"])])
def test_flex_limits_are_fanin_runs(name: str, accepted: list[str], refused: list[str]) -> None:
    """The template took window_s=90000, shards=1001 and deadline_s=0, which ``fanin run``
    then refused at launch, after the job had been asked for."""
    metadata = json.loads((FLEX / "metadata.json").read_text(encoding="utf-8"))
    (regex,) = next(p["regexes"] for p in metadata["parameters"] if p["name"] == name)
    assert [v for v in accepted + refused if re.fullmatch(regex, v)] == accepted
