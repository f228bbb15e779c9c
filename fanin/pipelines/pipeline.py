"""Assembling the Fanin pipeline: read -> parse -> key -> join -> write.

Guarantees:
- ``RunConfig.validate`` refuses bad settings with one clear ``ConfigError`` line.
- ``build`` wires stable, documented transform labels (``Read``, ``Parse``, ``Join``,
  ``MergeDeadLetters`` (streaming, or with BigQuery), ``Write/closes``, ``Write/late``,
  ``Write/dead_letter``, and ``Publish/<kind>`` when asked) so a Dataflow update keeps
  matching them (``tests/runners/test_transform_names.py``).
- ``choose_runner`` always names a runner explicitly, so no run tries to download Prism:
  bounded file input -> ``FnApiRunner``; ``--replay`` and Pub/Sub -> ``BundleBasedDirectRunner``
  (for replays measured against Prism: faster, and Prism 2.77 can emit a timer's output twice
  when it splits a bundle, apache/beam#35771; docs/runners.md).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    WorkerOptions,
)
from apache_beam.pvalue import PCollection
from apache_beam.runners.runner import PipelineRunner

from fanin.contracts.catalog import Catalog, JoinDefaults, load_contracts
from fanin.contracts.parsing import DEFAULT_MAX_BYTES
from fanin.contracts.timefmt import duration_ms
from fanin.core.outcomes import CLOSES, DEAD_LETTER, LATE
from fanin.io.output_lock import OutputLock, check_not_busy
from fanin.io.pubsub_drain import Drain, drain_on_signals
from fanin.pipelines.cloud_names import (
    SETUP_FILE_NAMES,
    validate_dataflow_location,
    validate_gcs_path,
)
from fanin.pipelines.collector import collector_for_run
from fanin.transforms.join import DEFAULT_MAX_BYTES_PER_JOIN, JoinRecords
from fanin.transforms.parse import KeyMessages, ParseMessages
from fanin.transforms.read import ReadNumberedLines, Source, expand_inputs, numbered_lines
from fanin.transforms.replay import MessageScan, Replay, build_replay, by_event_time
from fanin.transforms.write import (
    AT_END,
    BY_COUNT_OR_TIME,
    BY_TIME,
    FORMATS,
    WriteOutput,
    new_token,
)

__all__ = ["ConfigError", "RunConfig", "build", "catalog_for", "checkout_setup_file",
           "choose_runner", "configure_options", "early_firing", "replay_horizon_ms",
           "replay_of", "replay_retention_floor_ms", "run_pipeline", "runner_class_name",
           "runner_in"]

_LOG = logging.getLogger("fanin")
MAX_WINDOW_S = 86_400  # --window-s: outputs are written at least once a day
MAX_SHARDS = 1_000  # --shards: file names give a shard three digits (s000-s999)


class ConfigError(ValueError):
    """A setting is invalid; the message is one line for the user."""


@dataclass
class RunConfig:
    """Everything ``fanin run`` needs besides Beam's own options."""

    output: str
    inputs: Sequence[str] = ()
    contracts_path: str | None = None
    defaults: JoinDefaults = field(default_factory=JoinDefaults)
    formats: Sequence[str] = ("jsonl",)
    replay: bool = False
    max_disorder_s: float = 0.0
    max_bytes: int = DEFAULT_MAX_BYTES
    max_messages_per_join: int = 100_000
    max_bytes_per_join: int = DEFAULT_MAX_BYTES_PER_JOIN  # of messages (UTF-8)
    window_s: float = 60.0
    shards: int = 1
    subscription: str | None = None
    topic: str | None = None
    overwrite: bool = False
    id_label: str | None = None  # Pub/Sub attribute Dataflow deduplicates by (Dataflow only)
    bigquery_dataset: str | None = None  # also write each output to <dataset>.<kind>
    # optional Pub/Sub topics the outputs are also published to (kind -> topic)
    topics: dict[str, str] = field(default_factory=dict)
    log_closes: bool = False  # one fanin.close log line per close, also on workers

    def validate(self) -> None:
        if not self.output:
            raise ConfigError("--output is required")
        try:
            self.output.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8, escaped by Python
            raise ConfigError(f"--output {os.fsencode(self.output)!r}: not UTF-8; Beam names "
                              "the files it writes in UTF-8") from None
        if self.contracts_path == "" or "" in self.inputs:  # "" is no file (a glob of all)
            raise ConfigError("--contracts and --input name a file: an empty one names none")
        if "" in (self.subscription, self.topic, self.bigquery_dataset, *self.topics.values()):
            raise ConfigError("--subscription, --topic, --<kind>-topic and --bigquery-dataset "
                              "name a resource: an empty one names none")
        sources = bool(self.inputs) + bool(self.subscription) + bool(self.topic)
        if sources != 1:
            raise ConfigError("give exactly one of --input, --subscription, --topic")
        if self.replay and not self.inputs:
            raise ConfigError("--replay replays --input files")
        if self.id_label and not (self.subscription or self.topic):
            raise ConfigError("--id-label is for Pub/Sub input")
        self._validate_limits()
        if not self.formats or set(self.formats) - set(FORMATS):
            raise ConfigError(f"--format must be one or more of {', '.join(FORMATS)}")
        if set(self.topics) - {CLOSES, LATE, DEAD_LETTER}:
            raise ConfigError("output topics are for closes, late and dead_letter")
        if self.topics and not self.streaming:
            raise ConfigError("publishing outputs to Pub/Sub needs a streaming run "
                              "(--subscription, --topic or --replay)")
        self._validate_pubsub_paths()

    def _validate_limits(self) -> None:
        """Every size, count and duration option is in its range (the reason in one line)."""
        if not 0 <= self.max_disorder_s < math.inf:  # NaN fails too
            raise ConfigError("--max-disorder-s must be a finite number >= 0")
        if self.max_bytes <= 0 or self.max_messages_per_join < 1:
            raise ConfigError("--max-bytes and --max-messages-per-join must be >= 1")
        if self.max_messages_per_join >= sys.maxsize:  # the bounded plan counts to it + 1
            raise ConfigError(f"--max-messages-per-join must be < {sys.maxsize}")
        if self.max_bytes_per_join < self.max_bytes:
            raise ConfigError("--max-bytes-per-join must be >= --max-bytes (a join must hold "
                              "at least one message)")
        if not 0 < self.window_s <= MAX_WINDOW_S:  # NaN fails too
            raise ConfigError(f"--window-s must be > 0 and at most {MAX_WINDOW_S} (a day)")
        if not 1 <= self.shards <= MAX_SHARDS:
            raise ConfigError(f"--shards must be from 1 to {MAX_SHARDS}")

    def _validate_pubsub_paths(self) -> None:
        """Every Pub/Sub path is one the service accepts (the reason in one line if not)."""
        from fanin.io.pubsub import validate_pubsub_path

        paths = [(self.subscription, "subscriptions"), (self.topic, "topics")]
        paths += [(topic, "topics") for topic in self.topics.values()]
        try:
            for path, collection in paths:
                if path:
                    validate_pubsub_path(path, collection)
        except ValueError as error:
            raise ConfigError(str(error)) from None

    @property
    def reads_pubsub(self) -> bool:
        """A subscription's or a topic's run: its files join an earlier run's in ``output``."""
        return bool(self.subscription or self.topic)

    @property
    def streaming(self) -> bool:
        return self.replay or self.reads_pubsub


def choose_runner(config: RunConfig, options: PipelineOptions) -> str:
    """The runner to use: the user's ``--runner`` if given (``runner_class_name``), else the
    right local runner."""
    chosen = options.view_as(StandardOptions).runner
    if chosen:
        return runner_class_name(chosen)
    return "BundleBasedDirectRunner" if config.streaming else "FnApiRunner"


# every name of a runner Beam knows (its module path, its class name), lower case -> the class
_KNOWN_RUNNERS = {spelling.lower(): path.rsplit(".", 1)[-1]
                  for path in StandardOptions.ALL_KNOWN_RUNNERS
                  for spelling in (path, path.rsplit(".", 1)[-1])}


def runner_class_name(name: str) -> str:
    """A runner Beam knows, by any name Beam accepts for it (``dataflow``, ``dataflowrunner``,
    ``DataflowRunner``, its module path), as its class name (``DataflowRunner``), which every
    check of a runner compares with; any other name (a module path to another runner class)
    as given."""
    lower = name.lower()
    return _KNOWN_RUNNERS.get(lower) or _KNOWN_RUNNERS.get(f"{lower}runner") or name


def runner_in(beam_args: Sequence[str]) -> str | None:
    """The class name (``runner_class_name``) of the runner ``beam_args`` name; None for
    none."""
    named: str | None = PipelineOptions(list(beam_args)).view_as(StandardOptions).runner
    return None if named is None else runner_class_name(named)


def _check_runner_class(name: str) -> None:
    """A ``--runner`` given as a module path (``runner_class_name`` leaves a dot only in a
    runner Beam does not know) must name a ``PipelineRunner`` class that imports; else one
    ``ConfigError`` line (Beam's import of it was a traceback when the job was built)."""
    if "." not in name:
        return  # a runner Beam knows, or a name Beam refuses itself in one line
    module, _, attribute = name.rpartition(".")
    try:
        runner = getattr(importlib.import_module(module), attribute)
    except ImportError as exc:
        raise ConfigError(f"--runner {name}: cannot import {module}: {exc}") from None
    except AttributeError:
        raise ConfigError(f"--runner {name}: {module} has no {attribute}") from None
    except Exception as exc:  # the module itself fails as it is imported
        raise ConfigError(f"--runner {name}: importing {module} failed: "
                          f"{type(exc).__name__}: {exc}") from None
    if not (isinstance(runner, type) and issubclass(runner, PipelineRunner)):
        raise ConfigError(f"--runner {name}: not a Beam runner class (a subclass of "
                          "apache_beam.runners.runner.PipelineRunner)")


# Runners whose triggers Beam's Python SDK executes in process (the others run them runner-side)
_PYTHON_TRIGGER_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner",
                           "FnApiRunner")


def early_firing(config: RunConfig, runner: str) -> str:
    """When a streaming write's pending lines are written early (``fanin.transforms.write``)
    on the runner of class name ``runner``:

    - a replay (a finite stream, read as fast as the runner goes): never, its files are
      written when it ends, as a bounded run's are (the cheapest write on the local runner;
      and Prism 2.77 panics on a processing-time trigger of a finite stream).
    - a live stream on a runner whose triggers Beam's Python code executes (the local runner):
      by time. That code fires the processing-time branch of "count or time" once per run
      (apache/beam#21262), which kept a live run's closes out of its files until the drain;
      alone, it fires every ``window_s``. The lines of one ``window_s`` stay in memory.
    - a live stream elsewhere (Dataflow, Flink, Prism execute triggers themselves): count or
      time, whichever comes first.
    """
    if config.replay:
        return AT_END
    return BY_TIME if runner in _PYTHON_TRIGGER_RUNNERS else BY_COUNT_OR_TIME


def catalog_for(config: RunConfig) -> Catalog:
    """The contracts of ``config`` (read now, from any Beam filesystem) and its defaults."""
    contracts = load_contracts(config.contracts_path) if config.contracts_path else {}
    return Catalog(contracts, config.defaults)


def _retentions_s(catalog: Catalog) -> list[float]:
    """Every ``retention_s`` a join can have: the default's and each contract's own."""
    return [catalog.defaults.retention_s] + [
        c.retention_s for c in catalog.contracts.values() if c.retention_s is not None]


def _longest_deadline_ms(catalog: Catalog) -> int:
    """The largest ``deadline_s`` a contract or the defaults give, in ms."""
    deadlines = [catalog.defaults.deadline_s] + [
        c.deadline_s for c in catalog.contracts.values() if c.deadline_s]
    return duration_ms(max(deadlines))


def replay_horizon_ms(catalog: Catalog) -> int:
    """Room after the last event for every deadline and tombstone (a Pub/Sub read's
    ``stale_after_ms``)."""
    return _longest_deadline_ms(catalog) + duration_ms(max(_retentions_s(catalog))) + 1


def replay_retention_floor_ms(catalog: Catalog) -> int:
    """The least ``retention_s`` any join can have, in ms: no tombstone expires sooner after
    its join's earliest time (the replay moves the watermark for a join's line only when a
    timer of that join may be due, ``fanin.transforms.replay``)."""
    return duration_ms(min(_retentions_s(catalog)))


def replay_of(lines: Iterable[tuple[bytes, Source]], catalog: Catalog,
              max_disorder_s: float, max_bytes: int = DEFAULT_MAX_BYTES) -> Replay:
    """The replay a streaming run from files reads and parses (``ParseMessages``' outputs),
    its lines scanned as the join parses them (``MessageScan``: a dead letter moves no
    watermark). Its watermark moves for a join's line only when a timer of that join may be
    due (``replay_retention_floor_ms``), and its last advance passes every deadline, not every
    tombstone: the join sets no timer for a tombstone that outlives the input
    (``JoinRecords``' ``input_end_ms`` = ``Replay.end_ms``).
    """
    replay = build_replay(lines, max_disorder_s, _longest_deadline_ms(catalog) + 1,
                          MessageScan(frozenset(catalog.contracts), max_bytes),
                          replay_retention_floor_ms(catalog))
    if replay.events > _SLOW_REPLAY_EVENTS and not replay.behind:
        _LOG.warning(
            "fanin: --replay: the stream splits into %d events (no line lags the file's latest "
            "event time: lines of a join_id used again after its join's tombstone ended, or "
            "lines after a timer of their join may be due), " + _SLOW_EVENTS, replay.events)
    elif replay.events > _SLOW_REPLAY_EVENTS:
        _LOG.warning(
            "fanin: --replay: %d lines lag the file's latest event time by more than "
            "--max-disorder-s %g (by up to %.0f s): they arrive behind the watermark (late if "
            "their join has closed, a fresh join if its tombstone is gone: docs/spec.md §4) "
            "and split the stream into %d events, " + _SLOW_EVENTS + "; --max-disorder-s %.0f "
            "covers this file's disorder",
            replay.behind, max_disorder_s, replay.largest_lag_ms / 1000, replay.events,
            math.ceil(replay.largest_lag_ms / 1000))
    return replay


# A replay of more events than this is slow (each costs the local runner a round of bundles:
# 0.1-0.3 s with 10,000 joins held, measured): worth a warning
_SLOW_REPLAY_EVENTS = 1_000
_SLOW_EVENTS = ("each a round of the local runner's bundles over the joins it holds, so this "
                "replay is slow (0.1 s or more per event)")


def build(p: beam.Pipeline, config: RunConfig, catalog: Catalog,
          drain: Drain | None = None
          ) -> dict[str, PCollection[Any] | tuple[PCollection[Any], ...]]:
    """Add the whole job to ``p``; returns the joined outputs by name (for tests): the dead
    letters of a bounded run without BigQuery are a tuple, those of the join and of the
    parse. ``drain`` stops a Pub/Sub read on the local runner (``fanin.io.pubsub_drain``)."""
    if config.replay:
        paths = expand_inputs(config.inputs)
        lines = by_event_time([numbered_lines(path) for path in paths],
                              MessageScan(frozenset(catalog.contracts), config.max_bytes))
        replay = replay_of(lines, catalog, config.max_disorder_s, config.max_bytes)
        # the replay parses each line as it reads it (ParseMessages' outputs; see Replay)
        parsed = p | "Read" >> replay
        input_end_ms: int | None = replay.end_ms
    else:
        if config.inputs:
            raw = p | "Read" >> ReadNumberedLines(expand_inputs(config.inputs))
        else:
            from fanin.io.pubsub import ReadMessages

            raw = p | "Read" >> ReadMessages(
                subscription=config.subscription, topic=config.topic, id_label=config.id_label,
                drain=drain, stale_after_ms=replay_horizon_ms(catalog))
        input_end_ms = None
        # the bounded plan shuffles raw messages, parsed after the shuffle (KeyMessages)
        parse = ParseMessages if config.streaming else KeyMessages
        parsed = raw | "Parse" >> parse(frozenset(catalog.contracts), config.max_bytes)
    joined = parsed.records | "Join" >> JoinRecords(catalog, config.streaming,
                                                    config.max_messages_per_join,
                                                    config.max_bytes_per_join,
                                                    log_closes=config.log_closes,
                                                    max_message_bytes=config.max_bytes,
                                                    input_end_ms=input_end_ms)
    dead_letters = (joined[DEAD_LETTER], parsed[DEAD_LETTER])
    if config.streaming or config.bigquery_dataset:  # sinks that take one PCollection
        dead_letters = dead_letters | "MergeDeadLetters" >> beam.Flatten()
    # else the file write spills each step's dead letters where they are made (WriteOutput):
    # FnApiRunner would hold a Flatten of the two stages' outputs whole between them
    outputs = {CLOSES: joined[CLOSES], LATE: joined[LATE], DEAD_LETTER: dead_letters}
    early = early_firing(config, type(p.runner).__name__)
    token = new_token()  # in this job's file names: a later job never overwrites them
    if config.streaming:
        _LOG.info("fanin: output files of this job are named <kind>-%s-p<pane>-s<shard>", token)
    for kind, pcoll in outputs.items():
        folder = FileSystems.join(config.output, kind)
        pcoll | f"Write/{kind}" >> WriteOutput(folder, kind, config.formats, config.streaming,
                                               config.window_s, config.shards, token=token,
                                               early=early)
        if kind in config.topics:
            from fanin.io.pubsub import PublishJson

            pcoll | f"Publish/{kind}" >> PublishJson(config.topics[kind])
        if config.bigquery_dataset:
            from fanin.io.bigquery import WriteOutputTable

            pcoll | f"BigQuery/{kind}" >> WriteOutputTable(config.bigquery_dataset, kind,
                                                           config.streaming)
    return outputs


def _check_bigquery_options(config: RunConfig, options: PipelineOptions) -> None:
    """A bounded run's BigQuery write loads files staged under ``--temp_location`` (a
    ``gs://`` path): refuse (``ConfigError``) a run without it before anything starts or is
    written, rather than failing inside the job."""
    if not config.bigquery_dataset or config.streaming:
        return
    if not (options.view_as(GoogleCloudOptions).temp_location or "").startswith("gs://"):
        raise ConfigError("--bigquery-dataset: a bounded run loads its rows through files, so "
                          "it needs --temp_location=gs://BUCKET/PATH")


def _prepare_output(output: str, overwrite: bool, kept: Sequence[tuple[str, str]] = (),
                    continues: bool = False, on_replace: Callable[[], None] | None = None
                    ) -> None:
    """Create the three folders; refuse to mix with an earlier run's files unless asked
    (``--overwrite`` deletes them), except for a run that ``continues`` earlier ones (a
    subscription's next run: its files, named with its own job token, join theirs, whose
    messages were acknowledged and cannot be read again); refuse (``ConfigError``) a path that
    is a file where a folder must be, any folder that cannot be created or written in, or
    ``--overwrite`` of a folder that holds one of the files the run reads, ``kept`` as
    ``(option, path)`` (its inputs, its contracts file: it would delete them before reading
    them) or that this user cannot empty (a folder in it not writable): nothing is deleted
    then. ``on_replace`` is called once, before the first deletion."""
    folders = _output_folders(output)
    for folder in folders:
        real = os.path.realpath(folder)
        for option, path in kept:
            if "://" not in path and os.path.commonpath([real, os.path.realpath(path)]) == real:
                raise ConfigError(f"{option} {path} is in {folder}, which this run replaces "
                                  "with its outputs; move it out first")
    replaced = _checked_folders(output, folders, overwrite, continues)
    if replaced and on_replace is not None:
        on_replace()
    for folder in folders:
        try:
            if folder in replaced:
                _empty(folder)
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:  # e.g. a read-only file system
            raise ConfigError(f"--output: cannot {'replace' if folder in replaced else 'create'} "
                              f"{folder}: {exc.strerror or exc}") from None
        if not _writable(folder):  # created, but not for us to write in (umask)
            raise ConfigError(f"--output: cannot write in {folder}: permission denied")


def _empty(folder: str) -> None:
    """Delete an output folder of an earlier run; a folder that is a symbolic link keeps the
    link and its target, emptied (as ``--output`` itself may be a link)."""
    if not os.path.islink(folder):
        shutil.rmtree(folder)
        return
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def _no_dangling_link(folder: str) -> None:
    """``ConfigError`` when ``folder`` is a symbolic link to nothing (or a loop of links):
    no folder can be created there."""
    if os.path.islink(folder) and not os.path.exists(folder):
        raise ConfigError(f"--output: {folder} is a symbolic link to nothing "
                          f"({os.readlink(folder)})")


def _checked_folders(output: str, folders: list[str], overwrite: bool, continues: bool
                     ) -> list[str]:
    """The output ``folders`` this run deletes first (``_prepare_output``), after every check
    passed: a refusal (``ConfigError``) deletes nothing."""
    replaced = []
    for folder in folders:
        for path in (output, folder):
            if os.path.exists(path) and not os.path.isdir(path):
                raise ConfigError(f"--output: {path} is a file, not a folder")
        _no_dangling_link(folder)
        if os.path.isdir(folder) and os.listdir(folder) and (overwrite or not continues):
            if not overwrite:
                raise ConfigError(f"{output} already holds outputs; pass --overwrite to "
                                  "replace them")
            for parent, _, _ in os.walk(folder):  # deleting a file needs its folder writable
                if not _writable(parent):
                    raise ConfigError(f"--overwrite: cannot delete the files in {parent}: "
                                      "permission denied")
            replaced.append(folder)
        elif os.path.isdir(folder) and not _writable(folder):
            raise ConfigError(f"--output: cannot write in {folder}: permission denied")
    return replaced


def _check_output_early(config: RunConfig) -> None:
    """The refusals of a local output folder that need nothing written (``_checked_folders``,
    and a file in its path), so that a refused run says one line and nothing else; the lock
    (``_locked_output``) checks again, holding the folder."""
    check_not_busy(config.output)
    ancestor = os.path.abspath(config.output)
    while not os.path.exists(ancestor) and os.path.dirname(ancestor) != ancestor:
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ConfigError(f"--output: {ancestor} is a file, not a folder")
    _checked_folders(config.output, _output_folders(config.output), config.overwrite,
                     config.reads_pubsub)


def _output_folders(output: str) -> list[str]:
    """The three output folders of ``output``."""
    return [os.path.join(output, kind) for kind in (CLOSES, LATE, DEAD_LETTER)]


def _writable(folder: str) -> bool:
    """This process may create and delete files in ``folder``."""
    return os.access(folder, os.W_OK | os.X_OK)


_FANIN_PROJECT = re.compile(r'^name\s*=\s*"fanin"\s*$', re.MULTILINE)


def checkout_setup_file() -> str | None:
    """``setup.py`` of the source checkout Fanin is imported from, or None: an installed copy
    (its package folder has no ``setup.py`` beside it, or one that is not Fanin's: Fanin's has
    a ``pyproject.toml`` beside it naming the project ``fanin``)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))  # <checkout>/fanin/pipelines/pipeline.py
    path = os.path.join(root, "setup.py")
    try:
        with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as handle:
            ours = _FANIN_PROJECT.search(handle.read()) is not None
    except (OSError, UnicodeDecodeError):
        return None
    return path if ours and os.path.isfile(path) else None


_PACKAGE_ENDINGS = (".tar", ".tar.gz", ".whl", ".zip")  # what Beam's stager takes


def _check_staged_files(setup: SetupOptions) -> None:
    """The local files Beam stages for the workers exist and are of the kind it takes (else
    its stager fails with a traceback once the graph is built)."""
    named = [("--setup_file", setup.setup_file), ("--requirements_file", setup.requirements_file),
             *(("--extra_package", package) for package in setup.extra_packages or [])]
    for option, path in named:
        if path and "://" not in path and not os.path.isfile(path):
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
            validate_gcs_path("staging_location", cloud.staging_location)
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


def _check_dataflow(config: RunConfig, options: PipelineOptions) -> None:
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


def configure_options(config: RunConfig, beam_args: Sequence[str]) -> PipelineOptions:
    """Beam's options for ``config``: the runner made explicit, streaming set when needed, and
    for Dataflow the checks of ``_check_dataflow`` (``ConfigError``, one line); a stream on
    FnApiRunner, which runs bounded pipelines only, is refused the same way."""
    options = PipelineOptions(list(beam_args))
    standard = options.view_as(StandardOptions)
    standard.runner = choose_runner(config, options)
    _check_runner_class(standard.runner)
    if config.streaming:
        standard.streaming = True
        if standard.runner == "FnApiRunner":  # Beam's bounded-only local runner
            raise ConfigError("FnApiRunner runs bounded input only; a stream (--replay, "
                              "Pub/Sub) runs on BundleBasedDirectRunner (the default), "
                              "PrismRunner or FlinkRunner")
    if standard.runner.endswith("DataflowRunner"):
        _check_dataflow(config, options)
    parallelism = options.get_all_options().get("parallelism")
    if isinstance(parallelism, int) and (parallelism == 0 or parallelism < -1):
        raise ConfigError(f"--parallelism must be 1 or more (-1: the runner's default), not "
                          f"{parallelism}")
    return options


def _check_pubsub_resources(config: RunConfig) -> None:
    """Before a local run: the subscription (or input topic) and the output topics exist, else
    one ``ConfigError`` line (instead of a runner failing with tracebacks once it reads)."""
    from fanin.io.pubsub import check_pubsub_resources

    topics = [config.topic] if config.topic else []
    try:
        check_pubsub_resources(config.subscription, [*topics, *config.topics.values()])
    except ValueError as error:
        raise ConfigError(str(error)) from None


def run_pipeline(config: RunConfig, beam_args: Sequence[str],
                 runner_instance: beam.runners.runner.PipelineRunner | None = None
                 ) -> beam.runners.runner.PipelineResult:
    """Validate, build and run the job; waits for it to finish, except a streaming job on
    Dataflow, which is left running once submitted. ``runner_instance``, when given, runs the
    job in place of a new instance of the ``--runner`` named in ``beam_args`` (which must name
    its class).

    Stopping a Pub/Sub run on the local runner: the first SIGINT (Ctrl-C) or SIGTERM drains it
    (reading stops, every open join closes as at its deadline, all outputs are written, and this
    returns normally); a second one exits 130 (``SystemExit``). See docs/reliability.md."""
    config.validate()
    catalog = catalog_for(config)
    options = configure_options(config, beam_args)
    runner = options.view_as(StandardOptions).runner
    _check_bigquery_options(config, options)
    if config.bigquery_dataset:
        from fanin.io.bigquery import check_credentials

        check_credentials()
    if (options.view_as(DirectOptions).direct_num_workers or 0) < 0:
        raise ConfigError("--direct_num_workers must be 1 or more (0: as many as the machine "
                          "has cores)")
    if config.streaming and not runner.endswith("DataflowRunner"):
        if config.id_label:  # offline, so before asking Pub/Sub
            raise ConfigError(f"--id-label needs the Dataflow runner; {runner} does not "
                              "deduplicate by it (the join's reducer counts redeliveries as "
                              "duplicates)")
        _check_pubsub_resources(config)
    if "://" not in config.output:
        _check_output_early(config)  # before the build logs (a replay's plan, file names)
    p = beam.Pipeline(runner=runner_instance, options=options)
    drain = Drain() if config.reads_pubsub else None
    build(p, config, catalog, drain)  # a missing input is reported here, before anything is written
    lock = _locked_output(config) if "://" not in config.output else None
    before = _files_in(config.output) if lock is not None else frozenset()
    result: beam.runners.runner.PipelineResult | None = None
    try:
        _LOG.info("fanin: runner %s, %s input", runner,
                  "streaming" if config.streaming else "bounded")
        if config.streaming and runner.endswith("PrismRunner"):
            _LOG.warning("fanin: Prism 2.77 may emit a stateful join's closes and late lines "
                         "more than once when it splits a bundle with timers "
                         "(apache/beam#35771), and hands the join a bundle's messages in "
                         "event-time order, not as they arrived (eager closes and per-join "
                         "limits follow that order; docs/runners.md); the default local "
                         "streaming runner does neither")
        with collector_for_run():
            result = p.run()
            if config.streaming and runner.endswith("DataflowRunner"):
                _LOG.info("fanin: streaming job submitted; it runs until drained or cancelled")
                return result
            with drain_on_signals(drain, _LOG) if drain else contextlib.nullcontext():
                result.wait_until_finish()
    except BaseException as exc:
        _stopped(exc, result, lock, before, config.output)
        raise
    if lock is not None:
        lock.finish()
    if config.reads_pubsub:
        from fanin.io.pubsub import report_stale

        report_stale()  # what the read counted since its last warning
    if config.topics:
        from fanin.io.pubsub_publish import report_unpublished

        report_unpublished()  # what the run's topics lack, before its summary line
    return result


def _stopped(exc: BaseException, result: beam.runners.runner.PipelineResult | None,
             lock: OutputLock | None, before: frozenset[str], output: str) -> None:
    """A run that stopped before its end: a job it started on a job service is cancelled on
    Ctrl-C (it would run on, writing into a folder no longer locked); the output folder keeps
    its mark if the run changed it (``OutputLock``), or if a second signal aborted its drain
    (``SystemExit``: the joins it held are in no file, though their messages were read and
    acknowledged, and an output topic may have some of their closes)."""
    if result is not None and isinstance(exc, KeyboardInterrupt):
        with contextlib.suppress(Exception):  # the local runner's job has stopped already
            result.cancel()
    if lock is not None and (lock.changed or isinstance(exc, SystemExit)
                             or _files_in(output) != before):
        lock.release()  # the outputs are partial: the folder keeps its mark
    elif lock is not None:
        lock.abandon()  # refused before it changed anything (at submission)


def _files_in(output: str) -> frozenset[str]:
    """Every file in the output folders of ``output`` (temporary ones too)."""
    return frozenset(os.path.join(root, name) for folder in _output_folders(output)
                     for root, _, names in os.walk(folder) for name in names)


def _locked_output(config: RunConfig) -> OutputLock:
    """Lock the local output folder for this run (``OutputLock``), then prepare it
    (``_prepare_output``): a run refused there leaves the folder as it was."""
    if os.path.exists(config.output) and not os.path.isdir(config.output):
        raise ConfigError(f"--output: {config.output} is a file, not a folder")
    _no_dangling_link(config.output)
    continues = config.reads_pubsub
    try:
        lock = OutputLock.acquire(config.output, continues, config.overwrite)
    except OSError as exc:  # e.g. a read-only file system, a folder not ours
        raise ConfigError(f"--output: cannot create or lock {config.output}: "
                          f"{exc.strerror or exc}") from None
    try:
        read = [("--input", path) for path in
                (expand_inputs(config.inputs) if config.inputs else ())]
        if config.contracts_path is not None:
            read.append(("--contracts", config.contracts_path))
        _prepare_output(config.output, config.overwrite, read, continues=continues,
                        on_replace=lock.mark_changed)
    except BaseException:
        if lock.changed:
            lock.release()  # it deleted earlier outputs: not the folder it found
        else:
            lock.abandon()
        raise
    return lock
