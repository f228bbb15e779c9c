"""Assembling the Fanin pipeline: read -> parse -> key -> join -> write, and running it.

Guarantees:
- ``build`` wires stable, documented transform labels (``Read``, ``Parse``, ``Join``,
  ``MergeDeadLetters`` (streaming, or with BigQuery), ``Write/closes``, ``Write/late``,
  ``Write/dead_letter``, and ``Publish/<kind>`` when asked) so a Dataflow update keeps
  matching them (``tests/runners/test_transform_names.py``).
- ``run_pipeline`` validates the settings (``fanin.pipelines.config``), chooses the runner
  (``fanin.pipelines.runner_choice``), checks a Dataflow job (``fanin.pipelines.dataflow_checks``)
  and the output folder (``fanin.pipelines.output_folder``) before anything is written, then
  runs the job; every refusal is one ``ConfigError`` line.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.pvalue import PCollection

from fanin.contracts.catalog import Catalog, load_contracts
from fanin.contracts.parsing import DEFAULT_MAX_BYTES
from fanin.contracts.timefmt import duration_ms
from fanin.core.outcomes import CLOSES, DEAD_LETTER, LATE
from fanin.io.output_lock import OutputLock
from fanin.io.pubsub_drain import Drain, drain_on_signals
from fanin.pipelines.collector import collector_for_run
from fanin.pipelines.config import ConfigError, RunConfig
from fanin.pipelines.dataflow_checks import check_bigquery_options, check_dataflow
from fanin.pipelines.output_folder import (
    absent_folders,
    check_output_early,
    files_in,
    locked_output,
    remove_empty,
)
from fanin.pipelines.runner_choice import (
    check_close_processes,
    check_local_workers,
    check_runner_class,
    choose_runner,
    close_processes,
    early_firing,
    replay_processes,
)
from fanin.pipelines.split_replay import SplitReplay
from fanin.transforms.join import JoinRecords
from fanin.transforms.parse import KeyMessages, ParseMessages
from fanin.transforms.read import ReadNumberedLines, Source, expand_inputs, numbered_lines
from fanin.transforms.replay import MessageScan, Replay, build_replay, by_event_time
from fanin.transforms.write import WriteOutput, new_token

__all__ = ["ConfigError", "RunConfig", "beam_pipeline", "build", "catalog_for", "configure_options",
           "replay_horizon_ms", "replay_of", "replay_retention_floor_ms", "run_pipeline"]

_LOG = logging.getLogger("fanin")
def catalog_for(config: RunConfig) -> Catalog:
    """The contracts of ``config`` (read now, from any Beam filesystem) and its defaults."""
    contracts = load_contracts(config.contracts_path) if config.contracts_path else {}
    return Catalog(contracts, config.defaults)


def _retentions_s(catalog: Catalog) -> list[float]:
    """Every ``retention_s`` a join can have: the default's and each contract's own."""
    return [catalog.defaults.retention_s] + [
        c.retention_s for c in catalog.contracts.values() if c.retention_s is not None]


def _deadlines_s(catalog: Catalog) -> list[float]:
    """Every ``deadline_s`` a contract or the defaults give."""
    return [catalog.defaults.deadline_s] + [
        c.deadline_s for c in catalog.contracts.values() if c.deadline_s]


def _longest_deadline_ms(catalog: Catalog) -> int:
    """The largest ``deadline_s`` a contract or the defaults give, in ms."""
    return duration_ms(max(_deadlines_s(catalog)))


def replay_horizon_ms(catalog: Catalog) -> int:
    """Room after the last event for every deadline and tombstone (a Pub/Sub read's
    ``stale_after_ms``)."""
    return _longest_deadline_ms(catalog) + duration_ms(max(_retentions_s(catalog))) + 1


def replay_retention_floor_ms(catalog: Catalog) -> int:
    """The least ``retention_s`` any join can have, in ms: no tombstone expires sooner after
    its join's earliest time (the replay moves the watermark for a join's line only when a
    timer of that join may be due, ``fanin.transforms.replay``)."""
    return duration_ms(min(_retentions_s(catalog)))


def _deadline_floor_ms(catalog: Catalog) -> int:
    """The least ``deadline_s`` a contract or the defaults give, in ms; 0 when a contract or
    the defaults close on the watermark (such a join closes by a timer at its close time,
    before its deadline). A replay moves its watermark every so many lines only when a
    deadline may have passed (``fanin.transforms.replay``)."""
    if catalog.defaults.close_trigger == "watermark" or any(
            c.close_trigger == "watermark" for c in catalog.contracts.values()):
        return 0
    return duration_ms(min(_deadlines_s(catalog)))


def replay_of(lines: Iterable[tuple[bytes, Source]], catalog: Catalog,
              max_disorder_s: float, max_bytes: int = DEFAULT_MAX_BYTES,
              partitions: int = 1, processes: int = 1) -> Replay:
    """The replay a streaming run from files reads and parses (``ParseMessages``' outputs),
    its lines scanned as the join parses them (``MessageScan``: a dead letter moves no
    watermark). Its watermark moves for a join's line only when a timer of that join may be
    due (``replay_retention_floor_ms``), every so many lines only when a deadline may have
    passed (``_deadline_floor_ms``), and its last advance passes every deadline, not every
    tombstone: the join sets no timer for a tombstone that outlives the input
    (``JoinRecords``' ``input_end_ms`` = ``Replay.end_ms``). ``partitions``: the joins split
    into so many partitions, each replayed by a job of its own (``SplitReplay``);
    ``processes``: the lines parsed for the plan by this process and ``processes - 1``
    helpers.
    """
    replay = build_replay(lines, max_disorder_s, _longest_deadline_ms(catalog) + 1,
                          MessageScan(frozenset(catalog.contracts), max_bytes),
                          replay_retention_floor_ms(catalog),
                          deadline_floor_ms=_deadline_floor_ms(catalog), partitions=partitions,
                          processes=processes)
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


def _planned_replay(config: RunConfig, catalog: Catalog, partitions: int = 1) -> Replay:
    """The replay of ``config``'s input files (read and planned now)."""
    paths = expand_inputs(config.inputs)
    lines = by_event_time([numbered_lines(path, config.max_bytes) for path in paths],
                          MessageScan(frozenset(catalog.contracts), config.max_bytes))
    return replay_of(lines, catalog, config.max_disorder_s, config.max_bytes, partitions,
                     partitions)


def build(p: beam.Pipeline, config: RunConfig, catalog: Catalog,
          drain: Drain | None = None, split: SplitReplay | None = None, partition: int = 0
          ) -> dict[str, PCollection[Any] | tuple[PCollection[Any], ...]]:
    """Add the whole job to ``p``; returns the joined outputs by name (for tests): the dead
    letters of a bounded run without BigQuery are a tuple, those of the join and of the
    parse. ``drain`` stops a Pub/Sub read on the local runner (``fanin.io.pubsub_drain``).
    ``split``: the job replays the joins of ``partition`` of a split replay, and its writes
    leave their temporary files to ``split.finish()``."""
    processes = close_processes(p.options, config, type(p.runner).__name__)
    if config.replay:
        replay = split.replay if split is not None else _planned_replay(config, catalog)
        # the replay parses each line as it reads it (ParseMessages' outputs; see Replay)
        parsed = p | "Read" >> (replay.part(partition) if split is not None else replay)
        input_end_ms: int | None = replay.end_ms
    else:
        if config.inputs:
            raw = p | "Read" >> ReadNumberedLines(expand_inputs(config.inputs), config.max_bytes)
        else:
            from fanin.io.pubsub import ReadMessages

            raw = p | "Read" >> ReadMessages(
                subscription=config.subscription, topic=config.topic, id_label=config.id_label,
                drain=drain, stale_after_ms=replay_horizon_ms(catalog))
        input_end_ms = None
        contracts = frozenset(catalog.contracts)
        # the bounded plan shuffles raw messages, parsed after the shuffle (KeyMessages)
        parsed = raw | "Parse" >> (
            ParseMessages(contracts, config.max_bytes) if config.streaming
            else KeyMessages(contracts, config.max_bytes, processes))
    joined = parsed.records | "Join" >> JoinRecords(catalog, config.streaming,
                                                    config.max_messages_per_join,
                                                    config.max_bytes_per_join,
                                                    log_closes=config.log_closes,
                                                    max_message_bytes=config.max_bytes,
                                                    input_end_ms=input_end_ms,
                                                    close_processes=processes)
    dead_letters = (joined[DEAD_LETTER], parsed[DEAD_LETTER])
    if config.streaming or config.bigquery_dataset:  # sinks that take one PCollection
        dead_letters = dead_letters | "MergeDeadLetters" >> beam.Flatten()
    # else the file write spills each step's dead letters where they are made (WriteOutput):
    # FnApiRunner would hold a Flatten of the two stages' outputs whole between them
    outputs = {CLOSES: joined[CLOSES], LATE: joined[LATE], DEAD_LETTER: dead_letters}
    early = early_firing(config, type(p.runner).__name__)
    # in this job's file names: a later job never overwrites them
    token = split.token if split is not None else new_token()
    if config.streaming and partition == 0:
        _LOG.info("fanin: output files of this job are named <kind>-%s-p<pane>-s<shard>", token)
    for kind, pcoll in outputs.items():
        folder = FileSystems.join(config.output, kind)
        pcoll | f"Write/{kind}" >> WriteOutput(folder, kind, config.formats, config.streaming,
                                               config.window_s, config.shards, token=token,
                                               early=early, finalize=split is None)
        if kind in config.topics:
            from fanin.io.pubsub import PublishJson

            pcoll | f"Publish/{kind}" >> PublishJson(config.topics[kind])
        if config.bigquery_dataset:
            from fanin.io.bigquery import WriteOutputTable

            pcoll | f"BigQuery/{kind}" >> WriteOutputTable(config.bigquery_dataset, kind,
                                                           config.streaming)
    return outputs


def configure_options(config: RunConfig, beam_args: Sequence[str]) -> PipelineOptions:
    """Beam's options for ``config``: the runner made explicit, streaming set when needed, and
    for Dataflow the checks of ``check_dataflow`` (``ConfigError``, one line); a stream on
    FnApiRunner, which runs bounded pipelines only, is refused the same way, and so is Beam's
    ``--streaming`` on files (the job would be submitted as streaming with a bounded graph),
    and ``--close-processes`` where it does nothing (``check_close_processes``)."""
    options = PipelineOptions(list(beam_args))
    standard = options.view_as(StandardOptions)
    standard.runner = choose_runner(config, options)
    check_runner_class(standard.runner)
    check_close_processes(options, config, standard.runner)
    if config.streaming:
        standard.streaming = True
        if standard.runner == "FnApiRunner":  # Beam's bounded-only local runner
            raise ConfigError("FnApiRunner runs bounded input only; a stream (--replay, "
                              "Pub/Sub) runs on BundleBasedDirectRunner (the default), "
                              "PrismRunner or FlinkRunner")
    if standard.runner.endswith("DataflowRunner"):
        check_dataflow(config, options)
    if standard.streaming and not config.streaming:  # the graph built would be bounded
        raise ConfigError("--streaming: files are read as bounded input; a stream reads "
                          "Pub/Sub (--subscription, --topic) or replays a file (--replay)")
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


@contextlib.contextmanager
def beam_pipeline(options: PipelineOptions,
                  runner: beam.runners.runner.PipelineRunner | None = None
                  ) -> Iterator[beam.Pipeline]:
    """A ``beam.Pipeline`` whose local temporary folder is gone when the block ends: Beam
    makes one (``beam-pipeline-temp*``) when a pipeline is made and removes it only at the end
    of ``run()``, so a job refused before it runs (a missing input, a locked output folder)
    or only described (``--dry-run``) would leave it behind in the system's temporary
    folder."""
    p = beam.Pipeline(runner=runner, options=options)
    try:
        yield p
    finally:
        shutil.rmtree(p.local_tempdir, ignore_errors=True)


def _check_before_run(config: RunConfig, options: PipelineOptions, runner: str) -> None:
    """What a real run checks beyond ``configure_options`` (and the dry run), each refusal one
    ``ConfigError`` line before anything is built: BigQuery's options and credentials, the
    local runner's workers, a local stream's ``--id-label`` and Pub/Sub resources, the local
    output folder."""
    check_bigquery_options(config, options)
    if config.bigquery_dataset:
        from fanin.io.bigquery import check_credentials

        check_credentials()
    check_local_workers(options, runner, config.streaming)
    if config.streaming and not runner.endswith("DataflowRunner"):
        if config.id_label:  # offline, so before asking Pub/Sub
            raise ConfigError(f"--id-label needs the Dataflow runner; {runner} does not "
                              "deduplicate by it (the join's reducer counts redeliveries as "
                              "duplicates)")
        _check_pubsub_resources(config)
    if "://" not in config.output:
        check_output_early(config)  # before the build logs (a replay's plan, file names)


def _check_dataflow_input(config: RunConfig, runner: str) -> None:
    """A Dataflow job's files are read by its workers, which see no file of this machine: a
    local ``--input`` is ``ConfigError`` (the dry run reads a local copy while it builds the
    graph, and takes one)."""
    if runner.endswith("DataflowRunner") and not config.reads_pubsub:
        local = [path for path in config.inputs if "://" not in path]
        if local:
            raise ConfigError(f"--input {local[0]}: a Dataflow job's workers read its input: "
                              "give a gs:// path (--dry-run takes a local copy)")


def run_pipeline(config: RunConfig, beam_args: Sequence[str],
                 runner_instance: beam.runners.runner.PipelineRunner | None = None
                 ) -> beam.runners.runner.PipelineResult:
    """Validate, build and run the job; waits for it to finish, except a streaming job on
    Dataflow, which is left running once submitted (and a bounded one is left running when
    Ctrl-C stops the waiting; a job on another runner is cancelled then). ``runner_instance``,
    when given, runs the job in place of a new instance of the ``--runner`` named in
    ``beam_args`` (which must name its class).

    Stopping a Pub/Sub run on the local runner: the first SIGINT (Ctrl-C), SIGTERM or SIGHUP
    drains it (reading stops, every open join closes as at its deadline, all outputs are
    written, and this returns normally); a second one exits 130 (``SystemExit``). A run that
    stops otherwise (a failed write) logs how many messages its read had acknowledged. See
    docs/reliability.md."""
    config.validate()
    catalog = catalog_for(config)
    options = configure_options(config, beam_args)
    runner = options.view_as(StandardOptions).runner
    _check_before_run(config, options, runner)
    with beam_pipeline(options, runner_instance) as p:  # Beam validates its options here
        _check_dataflow_input(config, runner)
        drain = Drain() if config.reads_pubsub else None
        split = _split_replay(config, catalog, options, runner, runner_instance)
        # a missing input is reported here, before any write
        build(p, config, catalog, drain, split)
        absent = absent_folders(config.output) if "://" not in config.output else ()
        lock = locked_output(config, absent) if "://" not in config.output else None
        before = files_in(config.output) if lock is not None else frozenset()
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
            submitted = config.streaming and runner.endswith("DataflowRunner")
            # a local Pub/Sub read acknowledges what it pulls, from inside p.run(): a signal
            # drains from before it starts (it lost the first pulls' messages in between)
            with collector_for_run(), drain_on_signals(drain, _LOG) if drain and not submitted \
                    else contextlib.nullcontext():
                if split is not None:  # before this job starts its threads
                    split.start()
                result = p.run()
                if submitted:
                    _LOG.info("fanin: streaming job submitted; it runs until drained or cancelled")
                    return result
                result.wait_until_finish()
                if split is not None:
                    split.finish()
        except BaseException as exc:
            acknowledged = drain.acknowledged if drain is not None else 0
            # Ctrl-C leaves a Dataflow job running (docs/runners.md); a local one is cancelled
            _stopped(exc, None if runner.endswith("DataflowRunner") else result, lock, before,
                     config.output, absent, acknowledged)
            if acknowledged and lock is not None:
                _LOG.error("fanin: %d message(s) of %s were acknowledged before the run "
                           "stopped: those not in %s are lost (Pub/Sub does not deliver "
                           "them again)", acknowledged,
                           config.subscription or config.topic, config.output)
            raise
        finally:
            if split is not None:
                split.close()
        if lock is not None:
            lock.finish()
        if config.reads_pubsub:
            from fanin.io.pubsub import report_stale

            report_stale()  # what the read counted since its last warning
        if config.topics:
            from fanin.io.pubsub_publish import report_unpublished

            report_unpublished()  # what the run's topics lack, before its summary line
        return result


def _split_replay(config: RunConfig, catalog: Catalog, options: PipelineOptions, runner: str,
                  runner_instance: beam.runners.runner.PipelineRunner | None
                  ) -> SplitReplay | None:
    """A replay split across ``replay_processes`` processes (planned now), or None: one
    job."""
    processes = replay_processes(config, runner)
    if processes < 2:
        return None
    replay = _planned_replay(config, catalog, processes)
    outputs = [(FileSystems.join(config.output, kind), kind, config.formats)
               for kind in (CLOSES, LATE, DEAD_LETTER)]

    def run_part(partition: int) -> None:
        with beam_pipeline(options, runner_instance) as p:
            build(p, config, catalog, split=split, partition=partition)
            p.run().wait_until_finish()

    split = SplitReplay(replay, new_token(), outputs, run_part)
    return split


def _stopped(exc: BaseException, result: beam.runners.runner.PipelineResult | None,
             lock: OutputLock | None, before: frozenset[str], output: str,
             absent: Sequence[str], acknowledged: int = 0) -> None:
    """A run that stopped before its end: a job it started on a job service is cancelled on
    Ctrl-C (it would run on, writing into a folder no longer locked); the output folder keeps
    its mark if the run changed it (``OutputLock``), or if a second signal aborted its drain
    (``SystemExit``: the joins it held are in no file, though their messages were read and
    acknowledged, and an output topic may have some of their closes), or if its Pub/Sub read
    had ``acknowledged`` messages (a write that failed before any file was written: they are
    in no file and cannot be read again); else the mark goes and so do the output folders it
    made (``absent``) if they are empty: the folder is as it was."""
    if result is not None and isinstance(exc, KeyboardInterrupt):
        with contextlib.suppress(Exception):  # the local runner's job has stopped already
            result.cancel()
    if lock is not None and (lock.changed or isinstance(exc, SystemExit) or acknowledged
                             or files_in(output) != before):
        lock.release()  # the outputs are partial: the folder keeps its mark
    elif lock is not None:  # refused, or failed, before it changed anything
        lock.abandon()
        remove_empty(absent)  # the output folders it made: the folder is as it was
