"""The ``fanin`` command line.

Guarantees:
- Bad use (unknown option, missing input, unreadable contracts file, invalid value) prints one
  line ``fanin: error: ...`` on stderr and exits with code 2; never a traceback.
- ``fanin run`` passes every option it does not know to Beam (``--runner``,
  ``--direct_num_workers``, ``--direct_running_mode``, Dataflow options, ...), and for a
  job-server runner (Flink, Spark, portable) the options its job server defines
  (``--checkpointing_interval``, ...; ``fanin.runners.job_server_options``); any other
  option, or one the job server does not define, is bad use. So is a runner whose job
  server's jar or Prism binary Beam can neither find nor download, or whose job service does
  not answer (exit 2); a job the runner fails is one line, exit 1
  (``fanin.runners.toolchain.runner_failure``), as is a job that fails reading or writing
  files (a full disk). Ctrl-C stops a bounded run or a replay with one line and exit 130
  (its output folder keeps the mark of an unfinished run, ``fanin.io.output_lock``); a
  Pub/Sub run drains on the first (``fanin.io.pubsub_drain``).
- The runner is always explicit (see ``pipelines.runner_choice.choose_runner``) and is logged.
- Each subcommand's module is imported only when that subcommand runs: ``fanin --help``,
  ``fanin query`` and ``fanin report`` never import Apache Beam.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import io
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NoReturn

from fanin.contracts.shown import visible

if TYPE_CHECKING:
    from fanin.pipelines.config import RunConfig

__all__ = ["main"]

# Subcommand -> (module that adds it with ``add_subcommand(subparsers)``, one-line help).
# The module is imported only for its own subcommand; the others get a stub with the help.
_PLUGINS: dict[str, tuple[str, str]] = {
    "simulate": ("fanin.fleet.cli", "write simulated fleet traffic (JSON lines)"),
    "publish": ("fanin.io.cli", "publish a JSON-lines file to a Pub/Sub topic"),
    "query": ("fanin.analysis.cli", "run read-only SQL (DuckDB) over an output folder"),
    "report": ("fanin.analysis.cli", "summarise an output folder"),
    "setup": ("fanin.runners.toolchain", "build Prism / the Flink job server (registries only)"),
    "flink-cluster": ("fanin.runners.flink_cluster", "start/stop a local multi-process Flink "
                      "cluster"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(2, f"fanin: error: {visible(message.splitlines()[0])}\n")


def _add_run(subparsers: argparse._SubParsersAction[_Parser]) -> None:
    run = subparsers.add_parser(
        "run", help="run the join pipeline", description="Run the Fanin join pipeline. "
        "Options not listed here are passed to Apache Beam.")
    src = run.add_argument_group("input")
    src.add_argument("--input", action="append", default=[], metavar="GLOB",
                     help="newline-delimited JSON file(s), also .gz, .bz2, .zst, .xz...; "
                          "repeatable; any Beam filesystem")
    src.add_argument("--subscription",
                     help="Pub/Sub subscription projects/PROJECT/subscriptions/NAME")
    src.add_argument("--topic",
                     help="Pub/Sub topic projects/PROJECT/topics/NAME, read through a "
                     "subscription made for this run and deleted when it ends: messages "
                     "published while no run reads are not received (use --subscription)")
    src.add_argument("--id-label", metavar="ATTRIBUTE",
                     help="Pub/Sub attribute Dataflow deduplicates by (Dataflow only; the "
                     "local runner refuses it and the reducer's dedup applies)")
    src.add_argument("--replay", action="store_true",
                     help="replay --input as a stream: each file in its order, several "
                     "files merged by event time")
    src.add_argument("--max-disorder-s", type=float, default=None,
                     help="--replay only: its watermark trails the largest event time by this "
                     "(seconds, default 0; cover the file's disorder, or the replay is slow)")
    run.add_argument("--output", required=True, metavar="DIR")
    run.add_argument("--overwrite", action="store_true",
                     help="replace (delete) the outputs of an earlier run in DIR; without it "
                          "DIR must hold none, except for a Pub/Sub run, whose files join an "
                          "earlier run's")
    run.add_argument("--contracts", metavar="FILE", help="YAML contracts file")
    run.add_argument("--bigquery-dataset", metavar="PROJECT:DATASET",
                     help="also write closes, late and dead_letter to tables of this dataset "
                     "(schemas in fanin/contracts/bigquery/)")
    for kind in ("closes", "late", "dead-letter"):
        run.add_argument(f"--{kind}-topic", metavar="TOPIC",
                         help=f"also publish {kind.replace('-', ' ')} lines to this Pub/Sub "
                         "topic (streaming runs)")
    run.add_argument("--format", action="append", choices=("jsonl", "parquet"),
                     help="output format; repeat for both (default jsonl)")
    joins = run.add_argument_group("join defaults (for what opens and contracts leave out)")
    joins.add_argument("--deadline-s", type=float, default=30.0)
    joins.add_argument("--allow-partial", action=argparse.BooleanOptionalAction, default=False)
    joins.add_argument("--fail-fast", action=argparse.BooleanOptionalAction, default=False)
    joins.add_argument("--close-trigger", choices=("eager", "watermark"), default="eager")
    joins.add_argument("--retention-s", type=float, default=604800.0)
    limits = run.add_argument_group("limits")
    limits.add_argument("--max-bytes", type=int, default=256 * 1024,
                        help="largest message accepted, in bytes (below 2**62)")
    limits.add_argument("--max-messages-per-join", type=int, default=100_000,
                        help="most messages a join holds; a further one is late if the join "
                        "has closed, starts the next join if the join was undefined and "
                        "decided before it, else is a join_too_large dead letter "
                        "(docs/spec.md §4)")
    limits.add_argument("--max-bytes-per-join", type=int, default=16 * 1024 * 1024,
                        help="most bytes of messages a join holds (default 16 MiB, under "
                        "Dataflow's element and commit limits; at least --max-bytes, below "
                        "2**62); "
                        "further ones as with --max-messages-per-join")
    limits.add_argument("--window-s", type=float, default=None,
                        help="Pub/Sub runs only: longest wait (processing time, in seconds "
                        "rounded up, default 60, at most 86400) before pending outputs are "
                        "written to a file (a replay writes its files when it ends)")
    limits.add_argument("--shards", type=int, default=1,
                        help="files per output (bounded, replay), per write (Pub/Sub); "
                        "1 to 1000")
    run.add_argument("--close-processes", type=int, default=None, metavar="N",
                     help="on the local runner: processes that key messages and decide "
                     "joins (bounded) or replay them (--replay writing files), this one and "
                     "N-1 helpers forked from it (default: the cores this process may use, "
                     "at most 4; 1: none, 1 to 64)")
    run.add_argument("--log-closes", action=argparse.BooleanOptionalAction, default=False,
                     help="log one structured event per close (fanin.close logger; also "
                     "on Dataflow workers, one Cloud Logging entry per close)")
    run.add_argument(
        "--dry-run", metavar="FILE", default=None,
        help="build and check the job offline (pickling, deterministic key coders, option "
             "checks), write its graph as JSON to FILE and exit without running it")
    run.set_defaults(func=_run)


def _only_where_it_applies(args: argparse.Namespace) -> None:
    """Refuse an option given for a run it does nothing in (a user who forgot ``--replay``
    would believe the run was a stream)."""
    if args.max_disorder_s is not None and not args.replay:
        raise ValueError("--max-disorder-s applies to --replay only")
    if args.window_s is not None and args.input:
        raise ValueError("--window-s applies to Pub/Sub runs only (--subscription or --topic); "
                    "a replay and a bounded run write their files when they end")


def _run(args: argparse.Namespace, beam_args: Sequence[str]) -> int:
    from fanin.contracts.catalog import ContractsError
    from fanin.pipelines.pipeline import ConfigError, run_pipeline
    from fanin.runners.reported_failures import ReportedFailures

    reported = ReportedFailures.install()  # what the run says in one line, not logged again
    logging.getLogger("fanin.close").setLevel(logging.INFO if args.log_closes else logging.WARNING)
    try:
        config = _run_config(args)
        from fanin.runners.dry_run import maybe_dry_run
        from fanin.runners.toolchain import (
            check_job_endpoint,
            runner_failure,
            with_local_job_server,
        )

        beam_args = with_local_job_server(beam_args)

        code = maybe_dry_run(args, config, beam_args)
        if code is not None:
            return code
        check_job_endpoint(beam_args)
        runner = None
        if args.job_server_options:
            from fanin.runners.job_server_options import checked_runner

            runner = checked_runner(beam_args, args.job_server_options)
        # a subscription's next run writes beside an earlier run's files (any other run
        # starts from none, or deletes them)
        earlier = _files(args.output) if (args.subscription or args.topic) and \
            "://" not in args.output and not args.overwrite else frozenset()
        if args.own_process:  # what it holds now lives as long as it: never walked again
            gc.freeze()
        try:
            with _quiet_interrupts(), reported.worker_stderr(beam_args):
                try:
                    run_pipeline(config, beam_args, runner)
                except Exception as exc:  # the runner's failures: one line (runner_failure),
                    failure = None if _is_interrupt(exc) else runner_failure(exc, beam_args)
                    if failure is None:  # said while the job's workers are still kept quiet
                        raise
                    print(f"fanin: error: {visible(failure[0])}", file=sys.stderr)
                    if args.own_process:
                        reported.quiet_failed_job()
                    return failure[1]
        except KeyboardInterrupt:
            return _interrupted(args.output, beam_args)
        except Exception as exc:
            if _is_interrupt(exc):
                return _interrupted(args.output, beam_args)
            raise
    except (ConfigError, ContractsError, FileNotFoundError, ValueError,
            NotImplementedError) as exc:
        print(f"fanin: error: {visible(_one_line(exc))}", file=sys.stderr)
        return 2
    if "://" not in args.output:
        _summary(args.output, "jsonl" in config.formats, earlier)
    return 0


def _run_config(args: argparse.Namespace) -> RunConfig:
    """``fanin run``'s options as the job's settings; ``ConfigError`` for bad use."""
    from fanin.contracts.catalog import JoinDefaults
    from fanin.pipelines.pipeline import ConfigError, RunConfig

    _only_where_it_applies(args)
    try:
        defaults = JoinDefaults(args.deadline_s, args.allow_partial, args.fail_fast,
                                args.close_trigger, args.retention_s)
    except ValueError as exc:  # "deadline_s must be ...": named as the option given
        field, _, rest = str(exc).partition(" ")
        raise ConfigError(f"--{field.replace('_', '-')} {rest}") from None
    return RunConfig(
        output=args.output, inputs=args.input, contracts_path=args.contracts,
        defaults=defaults, formats=tuple(args.format or ("jsonl",)), replay=args.replay,
        max_disorder_s=args.max_disorder_s or RunConfig.max_disorder_s,
        max_bytes=args.max_bytes,
        max_messages_per_join=args.max_messages_per_join,
        max_bytes_per_join=args.max_bytes_per_join, log_closes=args.log_closes,
        close_processes=args.close_processes,
        window_s=RunConfig.window_s if args.window_s is None else args.window_s,
        shards=args.shards, subscription=args.subscription, topic=args.topic,
        overwrite=args.overwrite, id_label=args.id_label,
        bigquery_dataset=args.bigquery_dataset, topics={
            kind: topic for kind, topic in (("closes", args.closes_topic),
                                            ("late", args.late_topic),
                                            ("dead_letter", args.dead_letter_topic))
            if topic is not None})


def _is_interrupt(exc: BaseException) -> bool:
    """Ctrl-C inside a step: the local runner re-raises it as ``RuntimeError("KeyboardInterrupt
    [while running ...]")``."""
    return isinstance(exc, RuntimeError) and str(exc).startswith("KeyboardInterrupt")


def _interrupted(output: str, beam_args: Sequence[str]) -> int:
    """The line of a run stopped by Ctrl-C, and its exit status: a local folder says what it
    holds; a Dataflow job runs on (Ctrl-C stops the waiting, not the job); another runner's
    job was cancelled, having written what it had to ``output``."""
    from fanin.io.output_lock import UNFINISHED, folder_state
    from fanin.pipelines.runner_choice import runner_in

    if "://" in output and (runner_in(beam_args) or "").endswith("DataflowRunner"):
        print("fanin: interrupted: the Dataflow job runs on (stop it with gcloud dataflow jobs "
              "cancel or drain)", file=sys.stderr)
    elif "://" in output:
        print(f"fanin: interrupted: {visible(output)} may hold partial outputs",
              file=sys.stderr)
    elif folder_state(output) == UNFINISHED:
        print(f"fanin: interrupted: {visible(output)} holds partial outputs (run again with "
              "--overwrite)", file=sys.stderr)
    else:
        print("fanin: interrupted before it wrote anything", file=sys.stderr)
    return 130


class _NoInterruptLog(logging.Filter):
    """Drops the local runner's error log (with its traceback) of a step Ctrl-C stopped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not ((isinstance(record.msg, BaseException) and _is_interrupt(record.msg))
                    or isinstance(record.msg, KeyboardInterrupt))


@contextlib.contextmanager
def _quiet_interrupts() -> Iterator[None]:
    """While a run runs: a step stopped by Ctrl-C is not logged as an error (``_run`` says it in
    one line)."""
    logger, quiet = logging.getLogger("apache_beam.runners.common"), _NoInterruptLog()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _one_line(exc: BaseException) -> str:
    """The error's first line; with the lines after it when it ends in ``:`` (Beam's
    validation error puts its header there and the reasons on the next lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [""]
    return " ".join(lines) if lines[0].endswith(":") else lines[0]


def _files(output: str) -> frozenset[str]:
    """The paths of every file in ``output`` now."""
    return frozenset(os.path.join(root, name) for root, _, names in os.walk(output)
                     for name in names)


def _written(folder: str, jsonl: bool, earlier: frozenset[str] = frozenset()) -> int:
    """Outputs in ``folder`` but for the ``earlier`` files: lines of its JSONL files, else rows
    of its Parquet files (closes are in date partitions); hidden (temporary) files are not
    counted."""
    total = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        for name in files:
            path = os.path.join(root, name)
            if name.startswith((".", "_")) or path in earlier:
                continue
            if jsonl and name.endswith(".jsonl"):
                with open(path, "rb") as handle:
                    total += sum(1 for _ in handle)
            elif not jsonl and name.endswith(".parquet"):
                import pyarrow.parquet as pq  # loaded by the run that wrote Parquet

                total += pq.read_metadata(path).num_rows
    return total


def _summary(output: str, jsonl: bool, earlier: frozenset[str] = frozenset()) -> None:
    """One line: what the run wrote (counted from the files, which every runner honours; not
    the ``earlier`` runs' files a subscription's next run writes beside)."""
    counts = {kind: _written(os.path.join(output, kind), jsonl, earlier)
              for kind in ("closes", "late", "dead_letter")}
    parts = " ".join(f"{kind}={n}" for kind, n in counts.items())
    where = os.path.join(output, "{closes,late,dead_letter}")  # no "//" after "out/"
    print(f"fanin: done: {parts}; outputs in {visible(where)}/",
          file=sys.stderr)


def _unknown_beam_args(args: Sequence[str]) -> list[str]:
    """Arguments that neither Fanin nor any Beam ``PipelineOptions`` knows (bad values raise)."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    class _Raising(_BeamArgumentParser):  # the parser Beam gives its options
        def error(self, message: str) -> NoReturn:  # a Beam option with a bad value
            raise ValueError(message)

    parser = _Raising(allow_abbrev=False, add_help=False)
    seen: dict[str, type] = {}
    for cls in PipelineOptions.__subclasses__():
        seen.setdefault(str(cls), cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)
    return parser.parse_known_args(list(args))[1]


def _parser(command: str | None) -> _Parser:
    """The parser, with the full definition of ``command`` only (stubs for the others)."""
    parser = _Parser(prog="fanin", description="Fan-in joins for agent graphs on Apache Beam.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    if command == "run":
        _add_run(subparsers)
    else:
        subparsers.add_parser("run", help="run the join pipeline", add_help=False)
    wanted = _PLUGINS[command][0] if command in _PLUGINS else None
    for name, (module, text) in _PLUGINS.items():
        if name in subparsers.choices:
            continue
        if module == wanted:
            importlib.import_module(module).add_subcommand(subparsers)
        else:
            subparsers.add_parser(name, help=text, add_help=False)
    return parser


def _claim_closed_descriptors() -> None:
    """A process started with standard input, output or error closed (``2>&-``) gets
    ``/dev/null`` there: else the next file it opens takes that number (the output folder's
    lock took 2, and what was said on standard error went into it), and a closed standard
    error (Python holds None) made the first log line fail with a traceback no one saw, exit
    1. ``sys.stdout`` stays None where it was (the subcommands refuse to print a result
    there, in one line); ``sys.stderr`` writes to ``/dev/null``."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (for the process)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``fanin`` command; its exit status. Ctrl-C anywhere (also while it starts, before
    a subcommand handles it) is one line, exit 130. A message that the locale's encoding
    cannot spell (``PYTHONIOENCODING=ascii`` and a file name in another script) is written
    with backslash escapes, never a traceback; data written to standard output (``fanin
    query``'s result, ``fanin simulate --out -``) is UTF-8 or ASCII and is never escaped."""
    if argv is None:  # fanin's own process
        _collect_less()
    _claim_closed_descriptors()
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("fanin: interrupted", file=sys.stderr)
        return 130
    finally:
        if argv is None:  # fanin's own process, which ends next
            _before_exit()


# How many allocations (less deallocations) start a collection of the young generation in
# fanin's own process; Python's default is 700
RUN_GC_THRESHOLD = 100_000


def _collect_less() -> None:
    """From the start of fanin's own process, the young generation is collected every
    ``RUN_GC_THRESHOLD`` allocations instead of 700 (and what the process holds when its job
    starts, its imports, is frozen then: ``gc.freeze``, never walked again). Importing Beam
    makes ~170,000 objects that live as long as the process, and a runner makes and drops
    millions: the collector walked them over and over, ~0.1 s of the imports and ~0.2 s of a
    200,049-message bounded run (docs/performance.md). Reference cycles are still collected,
    a little later: at most that many more objects wait for it."""
    gc.set_threshold(RUN_GC_THRESHOLD, 10, 10)


def _before_exit() -> None:
    """Collect the garbage once, then freeze what is left (``gc.freeze``): the interpreter's
    teardown then runs every finalizer and ``atexit`` function as before, but its collector
    never walks the objects of the run again (with Beam imported, that walk took ~0.25 s of
    every run's end, docs/performance.md)."""
    gc.collect()
    gc.freeze()


def _main(argv: Sequence[str] | None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("fanin").setLevel(logging.INFO)
    own_process = argv is None  # the command line of a process that is fanin's own
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = _parser(command)
    args, rest = parser.parse_known_args(argv)
    args.own_process = own_process
    run: Callable[..., int] = args.func  # the subcommand's entry point
    if args.command != "run" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "run":
        try:
            unknown = _unknown_beam_args(rest)
        except ValueError as exc:
            parser.error(str(exc))
        args.job_server_options = []
        if unknown:  # options of a job server (Flink, Spark, portable), or a mistake
            from fanin.runners.job_server_options import job_server_option_names
            try:
                args.job_server_options = job_server_option_names(rest, unknown)
            except ValueError as exc:
                parser.error(str(exc))
        return run(args, rest)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
