"""What a Dataflow job (and a bounded BigQuery write) needs, checked before Beam builds it.

Guarantees: each check raises one ``ConfigError`` line (no network, no traceback) for what
Beam would refuse only at submission or the workers would fail on; ``check_dataflow`` adds
Fanin's own ``setup.py`` as ``--setup_file`` when Fanin runs from a source checkout and the
job ships no Fanin otherwise.
"""

from __future__ import annotations

import logging
import os
import re

from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    WorkerOptions,
)

from fanin.pipelines.cloud_names import (
    SETUP_FILE_NAMES,
    validate_dataflow_location,
    validate_gcs_path,
)
from fanin.pipelines.config import ConfigError, RunConfig

__all__ = ["check_bigquery_options", "check_dataflow", "checkout_setup_file", "staged_files"]

_LOG = logging.getLogger("fanin")


def check_bigquery_options(config: RunConfig, options: PipelineOptions) -> None:
    """A bounded run's BigQuery write loads files staged under ``--temp_location`` (a
    ``gs://`` path): refuse (``ConfigError``) a run without it before anything starts or is
    written, rather than failing inside the job."""
    if not config.bigquery_dataset or config.streaming:
        return
    if not (options.view_as(GoogleCloudOptions).temp_location or "").startswith("gs://"):
        raise ConfigError("--bigquery-dataset: a bounded run loads its rows through files, so "
                          "it needs --temp_location=gs://BUCKET/PATH")


_FANIN_PROJECT = re.compile(r'^name\s*=\s*"fanin"\s*$', re.MULTILINE)


def checkout_setup_file() -> str | None:
    """``setup.py`` of the source checkout Fanin is imported from, or None: an installed copy
    (its package folder has no ``setup.py`` beside it, or one that is not Fanin's: Fanin's has
    a ``pyproject.toml`` beside it naming the project ``fanin``)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))  # <checkout>/fanin/pipelines/dataflow_checks.py
    path = os.path.join(root, "setup.py")
    try:
        with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as handle:
            ours = _FANIN_PROJECT.search(handle.read()) is not None
    except (OSError, UnicodeDecodeError):
        return None
    return path if ours and os.path.isfile(path) else None


_PACKAGE_ENDINGS = (".tar", ".tar.gz", ".whl", ".zip")  # what Beam's stager takes


def staged_files(setup: SetupOptions) -> list[tuple[str, str]]:
    """``(option, path)`` of every file Beam stages for the workers that ``setup`` names."""
    named = [("--setup_file", setup.setup_file), ("--requirements_file", setup.requirements_file),
             *(("--extra_package", package) for package in setup.extra_packages or [])]
    return [(option, path) for option, path in named if path]


def _check_staged_files(setup: SetupOptions) -> None:
    """The local files Beam stages for the workers exist and are of the kind it takes (else
    its stager fails with a traceback once the graph is built)."""
    for option, path in staged_files(setup):
        if "://" not in path and not os.path.isfile(path):
            raise ConfigError(f"{option}: no such file: {path}")
    if setup.setup_file and os.path.basename(setup.setup_file) not in SETUP_FILE_NAMES:
        raise ConfigError(f"--setup_file: give Fanin's setup.py (Beam builds a pyproject.toml "
                          f"only with the build module and Fanin's build requirements "
                          f"installed here), not {setup.setup_file}")
    for package in setup.extra_packages or []:
        if not package.endswith(_PACKAGE_ENDINGS):
            raise ConfigError(f"--extra_package: {package} is not a package file (Beam takes "
                              f"{', '.join(_PACKAGE_ENDINGS)})")


def _check_dataflow_job(config: RunConfig, options: PipelineOptions) -> None:
    """Where the job runs and what it replaces, checked before Beam builds it (Beam checks
    some of it only at submission, over the network, with tracebacks): ``--project``,
    ``--region`` and ``gs://`` ``--temp_location`` given and well formed (``cloud_names``), as
    ``--staging_location`` when given; ``--output`` a ``gs://`` path with a valid bucket name
    (the workers cannot write to this machine, nor to S3 without boto3); ``--update`` only
    of a streaming job, ``--transform_name_mapping`` a JSON object of names, only with
    ``--update``; at-least-once mode only for a streaming job."""
    cloud = options.view_as(GoogleCloudOptions)
    missing = [f"--{n}" for n in ("project", "region", "temp_location") if not getattr(cloud, n)]
    if missing:
        raise ConfigError(f"DataflowRunner needs {', '.join(missing)}")
    try:
        validate_dataflow_location(cloud.project, cloud.region, cloud.temp_location)
        if cloud.staging_location:
            validate_gcs_path("staging_location", cloud.staging_location, folder=True)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not config.output.startswith("gs://"):  # s3:// needs boto3, which workers lack
        raise ConfigError(f"--output {config.output}: a Dataflow job writes where its workers "
                          "can, a gs:// path")
    try:
        validate_gcs_path("--output", config.output)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    streaming = bool(options.view_as(StandardOptions).streaming)
    mapping = cloud.transform_name_mapping
    if mapping is not None and not (isinstance(mapping, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in mapping.items())):
        raise ConfigError("--transform_name_mapping must be a JSON object of old transform name "
                          "-> new name")
    if mapping and not cloud.update:
        raise ConfigError("--transform_name_mapping applies to an --update only")
    if cloud.update and not streaming:
        raise ConfigError("--update replaces a running streaming job; a bounded job is run anew")
    if "streaming_mode_at_least_once" in (cloud.dataflow_service_options or []) and \
            not streaming:
        raise ConfigError("--dataflow_service_options=streaming_mode_at_least_once applies to "
                          "streaming jobs only")


def check_dataflow(config: RunConfig, options: PipelineOptions) -> None:
    """What a Dataflow job needs beyond Beam's own checks, for ``run_pipeline`` and the dry run.

    - ``--replay`` is refused: it embeds the input in the graph as a ``TestStream``, a test
      primitive Dataflow does not run.
    - The workers must get Fanin: from ``--sdk_container_image`` (an image with Fanin
      installed), ``--setup_file`` or ``--extra_package`` (a Fanin wheel or sdist). With none
      of them, Fanin's ``setup.py`` is added as ``--setup_file`` when Fanin runs from a source
      checkout (logged); otherwise the job is refused (the stock worker image cannot import
      ``fanin``). Local files named by those options must exist (``_check_staged_files``).
    """
    if config.replay:
        raise ConfigError("--replay embeds the input in the job as a TestStream, which Dataflow "
                          "does not run; use bounded --input or Pub/Sub (--subscription/--topic)")
    _check_dataflow_job(config, options)
    setup = options.view_as(SetupOptions)
    _check_staged_files(setup)
    worker = options.view_as(WorkerOptions)
    if (setup.setup_file or setup.extra_packages or worker.sdk_container_image
            or worker.worker_harness_container_image):
        return
    found = checkout_setup_file()
    if found is None:
        raise ConfigError("DataflowRunner: the workers need Fanin: pass --sdk_container_image "
                          "(an image with Fanin installed, e.g. deploy/flex), --extra_package "
                          "(a Fanin wheel or sdist) or --setup_file (a Fanin checkout's "
                          "setup.py)")
    setup.setup_file = found
    _LOG.info("fanin: workers get Fanin from --setup_file=%s (added)", found)
