"""``fanin run --dry-run FILE``: build the job as ``run_pipeline`` would, check it, run nothing.

Guarantees:
- The job graph is built by ``fanin.pipelines.pipeline.build`` with the same catalog and runner
  choice as ``run_pipeline``; nothing is executed, no output folder is created or touched.
- Offline: no call reaches the network and no credentials are looked up. For
  ``DataflowRunner`` the dry run sets Beam's ``--dry_run`` (which skips the GCS soft-delete
  probe when the pipeline is constructed and returns from ``DataflowRunner.run_pipeline`` before
  the API client exists), refuses options whose handling needs the network (missing region:
  Beam asks ``gcloud``; a bad bucket name: Beam creates a default bucket;
  ``--requirements_file``: ``pip download``; ``--prebuild_sdk_container_engine``: an image
  build; remote ``--input``/``--contracts``: read while the graph is built) and skips
  ``--update``'s job lookup (reported in ``skipped``). ``docs/runners.md`` lists the boundary.
- Checks, each failure one line in ``problems``: every transform's ``fn`` pickles with the
  runner's pickler; the key coder of every ``GroupByKey`` and stateful ``ParDo`` input, as
  inferred from type hints, is deterministic; ``--transform_name_mapping`` targets exist.
- ``FILE`` (written atomically) is JSON: the runner, the options, the stable transform names,
  the checks, the runner API proto (``pipeline``) and, for Dataflow, the job request body
  (``dataflow_job``) as far as it exists before staging (packages are listed, not uploaded).
  Its missing parent folders are created. A ``FILE`` that is empty, a remote path, a folder or
  under a file is refused before the graph is built, and one that cannot be written is refused
  after: a one-line ``DryRunError`` naming ``FILE`` as given; no temporary file is left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.coders.typecoders import registry
from apache_beam.internal import pickler
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DebugOptions,
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TestOptions,
)
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.transforms import userstate
from google.protobuf import json_format

from fanin.io.files import atomic_write, nearest_existing
from fanin.pipelines.dataflow_checks import staged_files
from fanin.pipelines.output_folder import enclosing_output
from fanin.pipelines.pipeline import (
    RunConfig,
    beam_pipeline,
    build,
    catalog_for,
    configure_options,
)
from fanin.transforms.read import expand_inputs

__all__ = [
    "DryRunError",
    "DryRunReport",
    "dry_run",
    "maybe_dry_run",
    "stable_names",
]


class DryRunError(ValueError):
    """The dry run cannot check this job offline, or cannot write its ``FILE``; the message is
    one line for the user."""


@dataclass(frozen=True)
class DryRunReport:
    """What a dry run found. ``ok`` is true when ``problems`` is empty."""

    runner: str
    streaming: bool
    out_path: str
    transform_names: tuple[str, ...]
    pickled: int
    key_coders: tuple[str, ...]
    dataflow_job: bool
    skipped: tuple[str, ...] = field(default=())
    problems: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        """Human summary, one finding per line."""
        mode = "streaming" if self.streaming else "bounded"
        head = (f"dry run: {self.runner}, {mode}; {self.pickled} fns pickled; "
                f"{len(self.key_coders)} key coders deterministic; graph in {self.out_path}"
                + (" (with the Dataflow job request)" if self.dataflow_job else ""))
        return ([head, "stable transform names: " + ", ".join(self.transform_names)]
                + [f"skipped: {s}" for s in self.skipped]
                + [f"problem: {p}" for p in self.problems])


def _coder_name(context: pipeline_context.PipelineContext, coder_id: str) -> str:
    return type(context.coders.get_by_id(coder_id)).__name__


def stable_names(proto: beam_runner_api_pb2.Pipeline) -> list[str]:
    """The names a Dataflow update matches, from a runner API proto, sorted.

    The top-level transforms' unique names; every stateful ``ParDo``'s unique name and those of
    its enclosing composites; for each stateful ``ParDo`` its key coder
    (``"<pardo> key=<coder class>"``), its state ids with their kind and coder
    (``"<pardo> state=<id> <bag|read_modify_write|...> <coder class>"``) and its timer ids with
    their time domain (``"<pardo> timer=<id> <EVENT_TIME|PROCESSING_TIME>"``). Renaming any of
    them, or changing a coder, breaks update compatibility or the state a job carries over.
    """
    context = pipeline_context.PipelineContext(proto.components)
    domains = beam_runner_api_pb2.TimeDomain.Enum
    transforms = proto.components.transforms
    parents = {child: tid for tid, t in transforms.items() for child in t.subtransforms}
    names = {transforms[child].unique_name
             for root in proto.root_transform_ids for child in transforms[root].subtransforms}
    for tid, transform in transforms.items():
        if transform.spec.urn != common_urns.primitives.PAR_DO.urn:
            continue
        payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
        if not (payload.state_specs or payload.timer_family_specs):
            continue
        name = transform.unique_name
        main = proto.components.pcollections[transform.inputs[next(
            tag for tag in transform.inputs if tag not in payload.side_inputs)]]
        key_coder = proto.components.coders[main.coder_id].component_coder_ids[0]
        names.add(f"{name} key={_coder_name(context, key_coder)}")
        for sid, spec in payload.state_specs.items():
            kind = spec.WhichOneof("spec")
            inner = getattr(spec, kind)
            coder = next(getattr(inner, f) for f in ("element_coder_id", "coder_id",
                                                     "accumulator_coder_id", "key_coder_id")
                         if getattr(inner, f, ""))
            names.add(f"{name} state={sid} {kind.removesuffix('_spec')} "
                      f"{_coder_name(context, coder)}")
        names.update(f"{name} timer={tid_} {domains.Name(spec.time_domain)}"
                     for tid_, spec in payload.timer_family_specs.items())
        node = tid
        while node in parents and node not in proto.root_transform_ids:
            names.add(transforms[node].unique_name)
            node = parents[node]
    return sorted(names)


def _inside_beam_io(node: AppliedPTransform) -> bool:
    """Whether ``node`` is inside one of Beam's IO connectors (e.g. WriteToBigQuery's internal
    GroupByKeys): those keys are Beam's to choose; Fanin checks its own."""
    parent = node.parent
    while parent is not None and parent.transform is not None:
        if type(parent.transform).__module__.startswith("apache_beam.io."):
            return True
        parent = parent.parent
    return False


class _Checks(PipelineVisitor):
    """Pickles every transform's ``fn``; checks the key coders of keyed inputs."""

    def __init__(self) -> None:
        self.pickled = 0
        self.key_coders: list[str] = []
        self.unpicklable: list[str] = []
        self.problems: list[str] = []

    def enter_composite_transform(self, node: AppliedPTransform) -> None:
        self._pickle(node)

    def visit_transform(self, node: AppliedPTransform) -> None:
        self._pickle(node)
        transform = node.transform
        stateful = (isinstance(transform, beam.ParDo)
                    and userstate.is_stateful_dofn(transform.fn))
        if (stateful or isinstance(transform, beam.GroupByKey)) and \
                not _inside_beam_io(node):
            self._key_coder(node)

    def _pickle(self, node: AppliedPTransform) -> None:
        fn = getattr(node.transform, "fn", None)
        if fn is None:
            return
        try:
            pickler.loads(pickler.dumps(fn))
        except Exception as exc:  # any pickling failure is the finding
            self.unpicklable.append(f"{node.full_label}: {type(fn).__name__} does not pickle: "
                                 f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        else:
            self.pickled += 1

    def _key_coder(self, node: AppliedPTransform) -> None:
        (pcoll,) = node.main_inputs.values()
        coder = registry.get_coder(pcoll.element_type)
        if not coder.is_kv_coder():
            self.problems.append(f"{node.full_label}: input element type "
                                 f"{pcoll.element_type} is not a key-value pair")
            return
        key_coder = coder.key_coder()
        if key_coder.is_deterministic():
            self.key_coders.append(f"{node.full_label}: {key_coder}")
        else:
            self.problems.append(
                f"{node.full_label}: key coder {key_coder} (from element type "
                f"{pcoll.element_type}) is not deterministic; declare the key type upstream, "
                "e.g. .with_output_types(tuple[str, ...])")


def _local(name: str, path: str) -> None:
    if "://" in path:
        raise DryRunError(f"{name} {path}: a dry run reads it while building the graph; give a "
                          "local copy (a remote path would reach the network)")


def _prepare_dataflow(options: PipelineOptions, skipped: list[str]) -> None:
    """Refuse what needs the network; set Beam's ``--dry_run``."""
    cloud = options.view_as(GoogleCloudOptions)  # its location: checked by configure_options
    setup = options.view_as(SetupOptions)
    if setup.requirements_file:
        raise DryRunError("--requirements_file: Beam runs pip download to stage it (network); "
                          "use --setup_file or --sdk_container_image")
    if setup.prebuild_sdk_container_engine:
        raise DryRunError("--prebuild_sdk_container_engine builds and pushes an image (network)")
    for name, path in staged_files(setup):  # --requirements_file: refused above
        if "://" in path:
            raise DryRunError(f"{name} {path}: Beam's stager fetches it while staging (network); "
                              "give a local copy for the dry run")
    if cloud.template_location or options.view_as(DebugOptions).dataflow_job_file:
        skipped.append("--template_location/--dataflow_job_file: Beam writes them only after "
                       "staging; the job request is in the dry-run file instead")
    options.view_as(TestOptions).dry_run = True


def _staged_names(proto: beam_runner_api_pb2.Pipeline) -> list[str]:
    """Names the artifacts of ``proto``'s environments would be staged under."""
    names = []
    for _, env in sorted(proto.components.environments.items()):
        for dep in env.dependencies:
            if dep.role_urn == common_urns.artifact_roles.STAGING_TO.urn:
                names.append(beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(
                    dep.role_payload).staged_name)
            else:
                names.append(os.path.basename(beam_runner_api_pb2.ArtifactFilePayload.FromString(
                    dep.type_payload).path))
    return list(dict.fromkeys(names))


def _dataflow_job(job: Any) -> dict[str, Any]:
    """The job request body ``DataflowApplicationClient.create_job_description`` would send,
    built offline: the same ``apiclient.Environment``, without uploading anything."""
    from apache_beam.runners.dataflow.internal import apiclient
    from apache_beam.runners.internal import names as shared_names

    staging = job.options.view_as(GoogleCloudOptions).staging_location
    job.proto.environment = apiclient.Environment(
        packages=_staged_names(job.proto_pipeline), options=job.options,
        environment_version=apiclient._FNAPI_ENVIRONMENT_MAJOR_VERSION,
        proto_pipeline_staged_url=FileSystems.join(staging, shared_names.STAGED_PIPELINE_FILENAME),
        proto_pipeline=job.proto_pipeline,
        pipeline_proto_hash=hashlib.sha256(job.proto_pipeline.SerializeToString()).hexdigest(),
    ).proto
    return json.loads(job.json())


def _check_out_path(path: str, output: str | None) -> None:
    """Refuse a ``--dry-run`` FILE that can never be written as a local file, or that would
    be one more file in an output folder (the run's ``output``, an earlier run's)."""
    if not path or path.endswith(("/", os.sep)):
        raise DryRunError(f"--dry-run {path!r}: give a file name")
    if "://" in path:
        raise DryRunError(f"--dry-run {path}: give a local file")
    if os.path.isdir(path):
        raise DryRunError(f"--dry-run {path}: is a folder; give a file")
    parent = nearest_existing(os.path.dirname(os.path.abspath(path)))  # must be a folder
    if not os.path.isdir(parent):
        raise DryRunError(f"--dry-run {path}: {parent} is a file, not a folder")
    enclosing = enclosing_output(path, output)
    if enclosing is not None:
        raise DryRunError(f"--dry-run {path}: is in {enclosing}, an output folder (the next "
                          "run would refuse it, or delete the file); give a file outside it")


def _write_json(path: str, obj: dict[str, Any]) -> None:
    """Write ``obj`` to ``path`` as ``atomic_write`` writes a file (a named pipe or a
    descriptor is written in place, never replaced). Failure: ``DryRunError`` naming
    ``path``."""
    text = json.dumps(obj, indent=1, sort_keys=True, default=str).encode("utf-8")
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        atomic_write(path, lambda handle: handle.write(text))
    except OSError as exc:  # atomic_write names the file: said once here
        reason = exc.strerror or str(exc).removeprefix(f"cannot write {path!r}: ")
        raise DryRunError(f"--dry-run {path}: cannot write it: {reason}") from None


def _not_an_input(path: str, config: RunConfig) -> None:
    """Refuse a ``--dry-run`` FILE that is one of the run's inputs or its contracts file (it
    would be replaced by the report)."""
    if not os.path.exists(path):
        return
    named = [("input", given) for given in
             (expand_inputs(config.inputs) if config.inputs else [])]
    named.append(("contracts file", config.contracts_path or ""))
    for what, given in named:
        if given and "://" not in given and os.path.exists(given) and \
                os.path.samefile(given, path):
            raise DryRunError(f"--dry-run {path}: is the run's {what}; give another file")


def dry_run(config: RunConfig, beam_args: Sequence[str], out_path: str) -> DryRunReport:
    """Build the job for ``config`` and ``beam_args``, check it, write ``out_path``; run nothing.

    Raises ``ConfigError``/``ContractsError``/``DryRunError`` (all ``ValueError``) for settings
    that are invalid or cannot be checked offline; findings about the graph are in the
    report's ``problems``. What Beam's stager makes while it describes a Dataflow job (a
    folder with the job's sdist and pickled session, its requirements cache) goes to a
    temporary folder of the dry run's own, deleted at its end: it was left in the system's
    temporary folder on every run.
    """
    with tempfile.TemporaryDirectory(prefix="fanin-dry-run-") as scratch, \
            _temporary_files_in(scratch):
        return _dry_run(config, beam_args, out_path)


@contextlib.contextmanager
def _temporary_files_in(folder: str) -> Iterator[None]:
    """Python's temporary files and folders (``tempfile``, which Beam's stager uses) are made
    in ``folder`` while inside."""
    before, tempfile.tempdir = tempfile.tempdir, folder
    try:
        yield
    finally:
        tempfile.tempdir = before


def _dry_run(config: RunConfig, beam_args: Sequence[str], out_path: str) -> DryRunReport:
    """``dry_run``'s work, its temporary files confined."""
    config.validate()
    if not config.reads_pubsub:
        for path in config.inputs:
            _local("--input", path)
    if config.contracts_path:
        _local("--contracts", config.contracts_path)
    _check_out_path(out_path, config.output)
    _not_an_input(out_path, config)
    catalog = catalog_for(config)
    options = configure_options(config, beam_args)
    standard = options.view_as(StandardOptions)
    on_dataflow = standard.runner.endswith("DataflowRunner")
    skipped: list[str] = []
    if on_dataflow:
        _prepare_dataflow(options, skipped)
    else:
        skipped.append(f"{standard.runner}: no job request exists before the run")

    with beam_pipeline(options) as p:
        shown_options = p.options.get_all_options(drop_default=True)  # as given, --update included
        try:
            build(p, config, catalog)
        except RuntimeError as exc:  # Beam pickles each fn when a ParDo is made
            if "pickle" not in str(exc):
                raise
            raise DryRunError(str(exc).splitlines()[0]) from None
        checks = _Checks()
        p.visit(checks)
        problems = checks.unpicklable + checks.problems
        names: list[str] = []
        pipeline_json = job = None
        if not checks.unpicklable:  # else the graph cannot be serialized at all
            proto = p.to_runner_api()
            names = stable_names(proto)
            mapping = options.view_as(GoogleCloudOptions).transform_name_mapping or {}
            every_name = {t.unique_name for t in proto.components.transforms.values()}
            problems += [f"--transform_name_mapping maps {old!r} to {new!r}, which is not a "
                         "transform of the new graph"
                         for old, new in mapping.items() if new not in every_name]
            if on_dataflow:
                cloud = p.options.view_as(GoogleCloudOptions)  # the Pipeline copied the options
                if cloud.update:  # apiclient.Job() would look the running job up (Dataflow API)
                    skipped.append("--update: finding the running job's id needs the Dataflow "
                                   "API; the job request is shown without replaceJobId and "
                                   "transformNameMapping")
                    cloud.update, cloud.transform_name_mapping = False, None
                # Beam's --dry_run: returns before any API client exists, a result carrying the
                # job request as an attribute it sets
                result: Any = p.run()
                job = result.job
                proto = job.proto_pipeline  # what Dataflow would receive (after its overrides)
            pipeline_json = json.loads(json_format.MessageToJson(proto))
    _write_json(out_path, {
        "runner": standard.runner,
        "streaming": bool(standard.streaming),
        "options": shown_options,
        "transform_names": names,
        "checks": {"pickled": checks.pickled, "key_coders": checks.key_coders},
        "skipped": skipped,
        "problems": problems,
        "pipeline": pipeline_json,
        "dataflow_job": _dataflow_job(job) if job is not None else None,
    })
    return DryRunReport(
        runner=standard.runner, streaming=bool(standard.streaming), out_path=out_path,
        transform_names=tuple(names), pickled=checks.pickled,
        key_coders=tuple(checks.key_coders), dataflow_job=job is not None,
        skipped=tuple(skipped), problems=tuple(problems))


def maybe_dry_run(args: argparse.Namespace, config: RunConfig, beam_args: Sequence[str]
                  ) -> int | None:
    """If ``--dry-run`` was given: do it, print the summary on stderr, return the exit code
    (0: no problems, 1: problems found). Otherwise return None and do nothing.

    Settings errors propagate as ``ValueError`` subclasses, for the caller's usual handling.
    """
    out_path = getattr(args, "dry_run", None)
    if out_path is None:
        return None
    report = dry_run(config, beam_args, out_path)
    for line in report.lines():
        print(f"fanin: {line}", file=sys.stderr)
    return 0 if report.ok else 1
