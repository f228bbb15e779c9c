"""Runner presets: lists of Beam command-line options to pass through ``fanin run``.

Each preset returns a new ``list[str]`` of ``--option=value`` strings that ``fanin run``
forwards to Beam unchanged (``fanin run --output out/ ... $(preset options)``); see
``docs/runners.md`` for the exact commands.

Guarantees:
- Every preset names its runner explicitly (``--runner=...``): no preset can fall back to the
  default ``SwitchingDirectRunner``, which tries to download Prism (docs/beam-notes.md).
- Every option a preset returns is one Apache Beam 2.77 ``PipelineOptions`` knows
  (``tests/runners/test_runners.py`` parses them back).
- Bad input raises ``ValueError`` with one line naming the argument and what is expected; a
  preset never returns options Beam would refuse later or that would make Beam reach the network
  to repair them (an invalid bucket name makes Beam try to create a default bucket).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping

import apache_beam as beam

from fanin.pipelines.cloud_names import (
    SETUP_FILE_NAMES,
    match_name,
    validate_dataflow_location,
    validate_gcs_path,
)

__all__ = [
    "DEFAULT_SETUP_FILE",
    "ENVIRONMENT_TYPES",
    "dataflow",
    "default_sdk_image",
    "direct",
    "flink",
    "portable",
    "spark",
    "validate_dataflow_location",
    "validate_gcs_path",
]

DEFAULT_SETUP_FILE = "./setup.py"
ENVIRONMENT_TYPES = ("LOOPBACK", "DOCKER", "PROCESS", "EXTERNAL")

# Google Cloud naming rules (documented limits; Beam's own checks are looser).
_JOB_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_MACHINE_TYPE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)+")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_HOST_PORT = re.compile(r"(https?://)?[A-Za-z0-9.-]+:[0-9]{1,5}")
_SPARK_MASTER = re.compile(r"local(\[([0-9]+|\*)\])?|spark://[A-Za-z0-9.-]+:[0-9]{1,5}")


def _positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def default_sdk_image() -> str:
    """The Beam SDK image matching this interpreter and the installed Beam version."""
    return (f"apache/beam_python{sys.version_info[0]}.{sys.version_info[1]}_sdk:"
            f"{beam.__version__}")


def direct(streaming: bool, workers: int = 1, multi_process: bool = False) -> list[str]:
    """Beam's local runners, chosen explicitly.

    Bounded: ``FnApiRunner``; ``workers > 1`` adds ``--direct_num_workers`` with threads, or
    processes when ``multi_process`` (docs/beam-notes.md: on 2 cores in-process was faster).
    Streaming: ``BundleBasedDirectRunner`` with ``--streaming``; it runs in one process, so
    ``workers`` and ``multi_process`` are refused there.
    """
    _positive("workers", workers)
    if multi_process and workers < 2:
        raise ValueError("multi_process needs workers >= 2")
    if streaming:
        if workers != 1 or multi_process:
            raise ValueError("BundleBasedDirectRunner (streaming) runs in one process: "
                             "workers and multi_process apply to FnApiRunner (bounded) only")
        return ["--runner=BundleBasedDirectRunner", "--streaming"]
    options = ["--runner=FnApiRunner"]
    if workers > 1:
        mode = "multi_processing" if multi_process else "multi_threading"
        options += [f"--direct_num_workers={workers}", f"--direct_running_mode={mode}"]
    return options


# One validation per keyword option.
def dataflow(project: str, region: str, temp_location: str, *, streaming: bool = True,  # noqa: C901
             exactly_once: bool = True, max_workers: int | None = None,
             num_workers: int | None = None, machine_type: str | None = None,
             service_account: str | None = None, setup_file: str | None = DEFAULT_SETUP_FILE,
             sdk_container_image: str | None = None, enable_streaming_engine: bool = True,
             job_name: str | None = None, update: bool = False,
             transform_name_mapping: Mapping[str, str] | None = None) -> list[str]:
    """Google Cloud Dataflow (Runner v2).

    Packaging: workers get Fanin from ``setup_file`` (default ``./setup.py``, relative to where
    ``fanin run`` is started) or from ``sdk_container_image`` (an image with Fanin installed,
    e.g. the Flex Template image). With an image the default ``setup_file`` is dropped; giving
    both explicitly is refused, as is giving neither.

    Streaming: ``exactly_once=False`` adds
    ``--dataflow_service_options=streaming_mode_at_least_once`` (cheaper; the join's reducer
    counts redelivered receipts as duplicates). Beam 2.77 runs every Python streaming job on
    Streaming Engine, so ``enable_streaming_engine=False`` is refused for streaming.

    Update: ``update=True`` needs ``streaming`` and the running job's ``job_name``;
    ``transform_name_mapping`` (old name -> new name) is only meaningful with ``update``.
    """
    validate_dataflow_location(project, region, temp_location)
    _positive("max_workers", max_workers)
    _positive("num_workers", num_workers)
    if max_workers is not None and num_workers is not None and num_workers > max_workers:
        raise ValueError(f"num_workers ({num_workers}) must be <= max_workers ({max_workers})")
    if sdk_container_image is not None:
        if not sdk_container_image.strip() or any(c.isspace() for c in sdk_container_image):
            raise ValueError(f"sdk_container_image must be an image name, got "
                             f"{sdk_container_image!r}")
        if setup_file not in (None, DEFAULT_SETUP_FILE):
            raise ValueError("give setup_file or sdk_container_image, not both: the image "
                             "already holds Fanin")
        setup_file = None
    elif setup_file is None:
        raise ValueError("workers need Fanin: give setup_file or sdk_container_image")
    if setup_file is not None and os.path.basename(setup_file) not in SETUP_FILE_NAMES:
        raise ValueError(f"setup_file must name Fanin's setup.py, got {setup_file!r}")
    if not streaming and not exactly_once:
        raise ValueError("exactly_once=False (at-least-once mode) applies to streaming only")
    if streaming and not enable_streaming_engine:
        raise ValueError("Beam 2.77 runs every Python streaming job on Dataflow with "
                         "Streaming Engine; enable_streaming_engine=False is not possible")
    if update:
        if not streaming:
            raise ValueError("update=True: only streaming jobs can be updated")
        if job_name is None:
            raise ValueError("update=True needs job_name: the name of the running job")
    elif transform_name_mapping:
        raise ValueError("transform_name_mapping applies to update=True only")

    options = ["--runner=DataflowRunner", f"--project={project}", f"--region={region}",
               f"--temp_location={temp_location}"]
    if streaming:
        options += ["--streaming", "--enable_streaming_engine"]
        if not exactly_once:
            options.append("--dataflow_service_options=streaming_mode_at_least_once")
    if job_name is not None:
        match_name("job_name", _JOB_NAME, job_name, "lower-case letters, digits and hyphens, "
                    "starting with a letter, at most 63 characters")
        options.append(f"--job_name={job_name}")
    if num_workers is not None:
        options.append(f"--num_workers={num_workers}")
    if max_workers is not None:
        options.append(f"--max_num_workers={max_workers}")
    if machine_type is not None:
        match_name("machine_type", _MACHINE_TYPE, machine_type, "a machine type such as "
                    "n2-standard-4")
        options.append(f"--machine_type={machine_type}")
    if service_account is not None:
        match_name("service_account", _EMAIL, service_account, "a service account e-mail")
        options.append(f"--service_account_email={service_account}")
    if setup_file is not None:
        options.append(f"--setup_file={setup_file}")
    if sdk_container_image is not None:
        options.append(f"--sdk_container_image={sdk_container_image}")
    if update:
        options.append("--update")
        if transform_name_mapping:
            if not all(isinstance(k, str) and k and isinstance(v, str) and v
                       for k, v in transform_name_mapping.items()):
                raise ValueError("transform_name_mapping must map non-empty old names to "
                                 "non-empty new names")
            mapping = json.dumps(dict(transform_name_mapping), separators=(",", ":"))
            options.append(f"--transform_name_mapping={mapping}")
    return options


def _environment(environment_type: str, environment_config: str | None) -> list[str]:
    """``--environment_type`` (+ ``--environment_config``) for the portable runners."""
    if environment_type not in ENVIRONMENT_TYPES:
        raise ValueError(f"environment_type must be one of {', '.join(ENVIRONMENT_TYPES)}, "
                         f"got {environment_type!r}")
    if environment_type == "LOOPBACK":
        if environment_config is not None:
            raise ValueError("environment_type LOOPBACK takes no environment_config")
        return ["--environment_type=LOOPBACK"]
    if environment_type == "DOCKER" and environment_config is None:
        environment_config = default_sdk_image()
    if not environment_config:
        raise ValueError(f"environment_type {environment_type} needs environment_config "
                         "(PROCESS: the JSON command; EXTERNAL: the worker pool host:port)")
    return [f"--environment_type={environment_type}",
            f"--environment_config={environment_config}"]


def portable(job_endpoint: str, environment_type: str = "LOOPBACK",
             environment_config: str | None = None) -> list[str]:
    """``PortableRunner`` against a job server that is already running (``host:port``).

    Nothing is downloaded: the job server (Flink's or Spark's) is whatever listens there.
    """
    match_name("job_endpoint", _HOST_PORT, job_endpoint, "host:port of a running job server")
    return ["--runner=PortableRunner", f"--job_endpoint={job_endpoint}",
            *_environment(environment_type, environment_config)]


def flink(master: str, parallelism: int, environment_type: str = "LOOPBACK",
          environment_config: str | None = None, *, job_server_jar: str | None = None
          ) -> list[str]:
    """``FlinkRunner``: ``master`` is ``host:port`` (or ``http://host:port``) or ``[local]``.

    Beam's FlinkRunner starts a job server from a jar; without ``job_server_jar`` (a local path)
    it downloads that jar from Maven Central on first use. ``DOCKER`` defaults its
    ``environment_config`` to the Beam SDK image of this Python and Beam version.
    """
    if master != "[local]":
        match_name("master", _HOST_PORT, master, "host:port, http://host:port or [local]")
    _positive("parallelism", parallelism)
    options = ["--runner=FlinkRunner", f"--flink_master={master}",
               f"--parallelism={parallelism}", *_environment(environment_type,
                                                             environment_config)]
    if job_server_jar is not None:
        options.append(f"--flink_job_server_jar={job_server_jar}")
    return options


def spark(master: str = "local[4]", environment_type: str = "LOOPBACK",
          environment_config: str | None = None, *, job_server_jar: str | None = None
          ) -> list[str]:
    """``SparkRunner``: ``master`` is ``spark://host:port``, ``local`` or ``local[N]``.

    Like Flink, Beam's SparkRunner downloads its job server jar unless ``job_server_jar`` is a
    local path.
    """
    match_name("master", _SPARK_MASTER, master, "spark://host:port, local or local[N]")
    options = ["--runner=SparkRunner", f"--spark_master_url={master}",
               *_environment(environment_type, environment_config)]
    if job_server_jar is not None:
        options.append(f"--spark_job_server_jar={job_server_jar}")
    return options
