"""Which runner a run uses, how its streaming writes fire there, and how many processes
decide a bounded run's joins on it.

Guarantees:
- ``choose_runner`` always names a runner explicitly, so no run tries to download Prism:
  bounded file input -> ``FnApiRunner``; ``--replay`` and Pub/Sub -> ``BundleBasedDirectRunner``
  (for replays measured against Prism: faster, and Prism 2.77 can emit a timer's output twice
  when it splits a bundle, apache/beam#35771; docs/runners.md).
- ``check_runner_class`` refuses (``ConfigError``, one line) a ``--runner`` module path that
  does not import or names no runner class, before Beam would import it with a traceback.
- ``close_processes`` is more than 1 only on ``FnApiRunner`` with one in-memory worker, for
  bounded input, and ``replay_processes`` only for a replay on ``BundleBasedDirectRunner``
  whose outputs are files only, where processes fork; ``check_close_processes`` refuses
  ``--close-processes`` anywhere else.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.runners.runner import PipelineRunner

from fanin.pipelines.config import ConfigError, RunConfig
from fanin.transforms.forked_helpers import FORKS
from fanin.transforms.write import AT_END, BY_COUNT_OR_TIME, BY_TIME

__all__ = ["AUTO_CLOSE_PROCESSES", "check_close_processes", "check_local_workers",
           "check_runner_class", "choose_runner", "close_processes", "early_firing",
           "replay_processes", "runner_class_name", "runner_in"]


def choose_runner(config: RunConfig, options: PipelineOptions) -> str:
    """The runner to use: the user's ``--runner`` if given (``runner_class_name``; an empty
    one is ``ConfigError``), else the right local runner."""
    chosen = options.view_as(StandardOptions).runner
    if chosen is not None and not chosen.strip():  # --runner "$RUNNER" with it unset
        raise ConfigError("--runner: an empty name names no runner; leave it out for the "
                          "local runner")
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


def check_runner_class(name: str) -> None:
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


# Beam's runners that run the pipeline in this process: they execute triggers in Python (the
# others run them runner-side), and a stream on them runs on one worker
_IN_PROCESS_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner",
                       "FnApiRunner")


def check_local_workers(options: PipelineOptions, runner: str, streaming: bool) -> None:
    """``--direct_num_workers`` is 1 or more, or 0 (a worker per core), and is not given to a
    stream on Beam's in-process runners, which run it on one worker whatever it says (else
    ``ConfigError``)."""
    workers = options.view_as(DirectOptions).direct_num_workers
    if (workers or 0) < 0:
        raise ConfigError("--direct_num_workers must be 1 or more (0: as many as the machine "
                          "has cores)")
    if workers not in (None, 1) and streaming and runner in _IN_PROCESS_RUNNERS:
        raise ConfigError(f"--direct_num_workers={workers} applies to bounded runs "
                          f"(FnApiRunner); a stream on {runner} runs one worker and would "
                          "ignore it")


def check_close_processes(options: PipelineOptions, config: RunConfig, runner: str) -> None:
    """``--close-processes`` is given only where it applies (``close_processes``), and above 1
    only where processes fork, else ``ConfigError``."""
    if config.close_processes is not None and not _one_local_worker(options, config, runner) \
            and not _split_replay(config, runner):
        raise ConfigError("--close-processes applies to a bounded run on FnApiRunner (the "
                          "local runner fanin run picks for files) with one worker (no "
                          "--direct_num_workers, no --direct_running_mode), and to a replay "
                          "on BundleBasedDirectRunner (the default) that writes files only "
                          "(no Pub/Sub topics, no BigQuery); this run's steps run where its "
                          "runner puts them")
    if (config.close_processes or 1) > 1 and not FORKS:
        raise ConfigError("--close-processes above 1 forks helpers, and this system has no "
                          "fork")


# --close-processes when not given: the cores this process may use, at most this many (each
# helper is a forked copy of the run's memory; measured on 2 cores only, docs/performance.md)
AUTO_CLOSE_PROCESSES = 4


def _one_local_worker(options: PipelineOptions, config: RunConfig, runner: str) -> bool:
    direct = options.view_as(DirectOptions)
    return (not config.streaming and runner == "FnApiRunner"
            and direct.direct_num_workers in (None, 1)
            and direct.direct_running_mode in (None, "in_memory"))


def close_processes(options: PipelineOptions, config: RunConfig, runner: str) -> int:
    """How many processes key a bounded run's messages and decide its joins (the key and
    close steps and their forked helpers, ``fanin.transforms.parse``,
    ``fanin.transforms.join_bounded``): on Beam's in-process bounded runner with one
    worker, ``--close-processes``, by default the cores this process may use up to
    ``AUTO_CLOSE_PROCESSES``; 1 anywhere else (a stream, and runners that run workers of their
    own, which use their cores themselves). Not given, it is 1 off Linux (macOS's system
    libraries are not safe to use in a forked child)."""
    return _processes(config) if _one_local_worker(options, config, runner) else 1


def replay_processes(config: RunConfig, runner: str) -> int:
    """How many processes replay a replay's joins (``fanin.pipelines.split_replay``): for a
    replay on ``BundleBasedDirectRunner`` (the default) that writes files only (no Pub/Sub
    topic, no BigQuery table: each process would publish or stream its own part),
    ``--close-processes``, by default as ``close_processes``; 1 anywhere else."""
    return _processes(config) if _split_replay(config, runner) else 1


def _split_replay(config: RunConfig, runner: str) -> bool:
    return (config.replay and runner == "BundleBasedDirectRunner" and not config.topics
            and not config.bigquery_dataset)


def _processes(config: RunConfig) -> int:
    """``--close-processes``; not given, the cores this process may use up to
    ``AUTO_CLOSE_PROCESSES``, 1 off Linux (macOS's system libraries are not safe to use in a
    forked child)."""
    if config.close_processes is not None:
        return config.close_processes
    if not (FORKS and sys.platform.startswith("linux")):  # macOS: fork is unsafe there
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(AUTO_CLOSE_PROCESSES, cores or 1))


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
    return BY_TIME if runner in _IN_PROCESS_RUNNERS else BY_COUNT_OR_TIME
