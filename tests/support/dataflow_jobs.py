"""Settings of the example job for the Dataflow tests (tests/dataflow): config and options."""

from __future__ import annotations

from pathlib import Path

from fanin.pipelines.pipeline import RunConfig
from fanin.runners import dataflow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "fanin" / "examples"
IMAGE = "us-docker.pkg.dev/fanin-dry-run/fanin/fanin:2.77.0"
SUBSCRIPTION = "projects/fanin-dry-run/subscriptions/fanin-in"
LOCATION = ("fanin-dry-run", "us-central1", "gs://fanin-dry-run-bucket/tmp")


def example_config(streaming: bool, **overrides: object) -> RunConfig:
    """The example contracts; Pub/Sub input when ``streaming``, the example file otherwise."""
    source = ({"subscription": SUBSCRIPTION} if streaming
              else {"inputs": [str(EXAMPLES / "triage.jsonl")]})
    return RunConfig(output="gs://fanin-dry-run-bucket/out",
                     contracts_path=str(EXAMPLES / "contracts.yaml"), **{**source, **overrides})


def unpackaged_args(streaming: bool) -> list[str]:
    """Dataflow options that ship no Fanin to the workers (no image, setup file or package)."""
    project, region, temp = LOCATION
    return ["--runner=DataflowRunner", f"--project={project}", f"--region={region}",
            f"--temp_location={temp}", *(["--streaming"] if streaming else [])]


def dataflow_args(streaming: bool, **kwargs: object) -> list[str]:
    """The ``dataflow`` preset's options, with the Fanin image unless told otherwise."""
    kwargs.setdefault("sdk_container_image", IMAGE)
    return dataflow(*LOCATION, streaming=streaming, **kwargs)
