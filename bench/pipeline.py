"""Benchmark: whole Beam pipelines on the local runners (see docs/performance.md).

Usage: ``python bench/pipeline.py [--quick] [--messages 200000] [--stream-messages 20000]
[--repeats 3] [--only headline|memory|state|bounded|stream|growth|trigger]``

Workloads come from the fleet simulator (``write_simulation``, bundled contracts) written to
files in a temporary folder; every pipeline reads those files. Variants of one part run
alternately inside one process so machine noise hits them alike; tables show medians of
``--repeats`` runs and ratios of medians.

- ``headline``: whole processes, interpreter start and imports included, alternated:
  ``fanin run`` (bounded, and ``--replay`` with the watermark trigger) against the hand-written
  Beam join ``bench/naive_join.py`` on ``fanin simulate`` traffic with the bundled contracts
  (JSON schemas), on the default local runners, and on Prism when ``fanin setup prism`` has put
  it where Beam looks. Wall and CPU (user + system of the process tree) medians, and ratios.
  With Prism there, one more row: the naive join run as its user would, with no ``--runner``
  (Beam's ``DirectRunner`` then takes Prism), against ``fanin run``'s default.
- ``bounded``: FnApiRunner. Fanin (``run_pipeline``) vs a naive Beam join (ReadFromText ->
  ``parse_message`` records -> GroupByKey -> ``bench/naive.py``'s reducer over each group sorted by
  event time -> json.dumps -> WriteToText) vs a floor (read + parse + write, no join).
- ``stream``: BundleBasedDirectRunner on the replay TestStream. Fanin (``replay=True``) vs a
  floor stateful DoFn (BagState append + one event-time timer per join) after the same replay
  source and parse step.
- ``growth``: Fanin bounded at N/10 and N messages; Fanin replay at S/4 and S messages.
- ``memory``: per-join streaming state of open joins (pickled and coder-encoded sizes) and the
  peak RSS of folding them into ``JoinReducer`` objects, in a fresh process.
- ``state``: per runner set up (default, Prism, Flink), memory per open join in the streaming
  state: ``fanin run --replay`` of ``--state-joins`` of the ``memory`` part's joins, each open
  until the replay ends, and of 1,000; the peak RSS of each kind of process in the run's tree
  (Python, Prism, Flink's JVM), sampled every 0.1 s; per join: the difference over the
  difference in joins.
- ``trigger``: replay throughput and close latency for the ``eager`` and ``watermark`` close
  triggers. The join DoFn is a ``JoinDoFn`` subclass that counts the records it received; the
  latency of a close = the largest event time among the records the join had received when it
  emitted the close, minus the close's ``closed_at`` (how far the stream had moved on in event
  time before the close came out).

Times: "run" is ``Pipeline.run()`` until finished (runner start-up included); pipeline
construction (building the graph, and for replays reading the file into the TestStream) is
measured separately and excluded from the rates.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import multiprocessing
import os
import pickle
import random
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import PipelineOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floor_join import floor_replay
from naive import NaiveJoin

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog, JoinDefaults, load_contracts
from fanin.contracts.parsing import parse_message
from fanin.contracts.timefmt import format_ms, parse_rfc3339
from fanin.core.outcomes import CLOSES, DEAD_LETTER, LATE
from fanin.fleet.simulate import CONTRACTS_PATH, write_simulation
from fanin.pipelines.pipeline import RunConfig, build, replay_of, run_pipeline
from fanin.runners.toolchain import with_local_job_server
from fanin.transforms.join import JoinDoFn, JoinRecords
from fanin.transforms.read import numbered_lines
from fanin.transforms.write import WriteOutput

PARTS = ("headline", "memory", "state", "bounded", "stream", "growth", "trigger")
_ROOT = Path(__file__).resolve().parent.parent
_BIN = Path(sys.executable).parent
_LINES_PER_JOIN = 6.9  # the simulator's default rates give ~6.9 lines per join
_SOURCE = {"kind": "file"}

# Probes of the trigger part. They live in this module's globals; the probe DoFns are used
# through this file imported as a module (``_probes()``) so that Beam pickles them by
# reference and every copy in the (in-process) BundleBasedDirectRunner shares these objects.
_PROBE: dict[str, int] = {"lines": 0, "max_seen": -(2**62)}
_STAMPS: list[tuple[str | None, str, int, int, int]] = []


# ------------------------------------------------------------------------- helpers
def _median(values: list[float]) -> float:
    return statistics.median(values)


def _table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(_cell(x) for x in row) + " |")
    sys.stdout.flush()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _workload(folder: str, messages: int, seed: int = 1) -> tuple[str, int]:
    """Simulated traffic of about ``messages`` lines in ``folder``; returns (path, lines)."""
    path = os.path.join(folder, f"sim-{messages}.jsonl")
    joins = max(1, round(messages / _LINES_PER_JOIN))
    summary = write_simulation(path, joins, seed)
    return path, summary.lines


def _catalog(defaults: JoinDefaults | None = None) -> Catalog:
    return Catalog(load_contracts(CONTRACTS_PATH), defaults or JoinDefaults())


def _timed(construct: Callable[[], beam.Pipeline]) -> tuple[float, float]:
    """(construction seconds, run seconds) of one pipeline."""
    start = time.perf_counter()
    p = construct()
    built = time.perf_counter()
    p.run().wait_until_finish()
    return built - start, time.perf_counter() - built


def _options(streaming: bool) -> PipelineOptions:
    if streaming:
        return PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    return PipelineOptions(["--runner=FnApiRunner"])


# ------------------------------------------------------------------------- headline
# As a user's installation runs: compiled modules are cached (pip compiles on install), so a
# run does not recompile Fanin's modules each time as with PYTHONDONTWRITEBYTECODE set.
_USER_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _process(cmd: list[str]) -> tuple[float, float, float]:
    """Run ``cmd`` to the end: (wall s, CPU s of it and its waited-for children, peak RSS MiB
    of the largest of them; Linux keeps a forked child's peak across ``exec``, so it is never
    below this benchmark's own, ~185 MiB at the headline's sizes). Its stderr goes to a file (a
    pipe read after the wait would block a child that writes more than the pipe holds)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(cmd, cwd=_ROOT, env=_USER_ENV, stdout=subprocess.DEVNULL,
                                stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        stderr.seek(0)
        err = stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def _simulate(folder: str, joins: int, seed: int = 1) -> tuple[str, int]:
    path = os.path.join(folder, f"fleet-{joins}-{seed}.jsonl")
    if not os.path.exists(path):
        summary = write_simulation(path, joins, seed)
        return path, summary.lines
    with open(path, "rb") as handle:
        return path, sum(1 for _ in handle)


def _sorted_by_event_time(path: str) -> str:
    """A copy of ``path`` with its lines in event-time order (ties and unreadable times keep
    file order): the input on which a replay with the watermark trigger must give exactly the
    bounded run's outputs."""
    from fanin.transforms.replay import scan_line

    lines = Path(path).read_bytes().splitlines(keepends=True)
    order = sorted(range(len(lines)),
                   key=lambda i: (scan_line(lines[i].rstrip(b"\r\n"))[0] or 0, i))
    out = path[:-len(".jsonl")] + "-sorted.jsonl"
    Path(out).write_bytes(b"".join(lines[i] for i in order))
    return out


def _prism() -> bool:
    """Whether Prism is where Beam looks for it (``fanin setup prism``)."""
    try:
        from fanin.runners.toolchain import prism_binary
    except ImportError:
        return False
    return os.path.exists(prism_binary())


def _fanin_cmd(path: str, out: str, *extra: str) -> list[str]:
    return [str(_BIN / "fanin"), "run", "--input", path, "--contracts", CONTRACTS_PATH,
            "--output", out, "--overwrite", *extra]


def _naive_cmd(path: str, out: str, *extra: str) -> list[str]:
    return [sys.executable, str(_ROOT / "bench" / "naive_join.py"), "--input", path,
            "--contracts", CONTRACTS_PATH, "--output", os.path.join(out, "closes"), *extra]


def _same_outputs(a: str, b: str) -> str:
    """"yes" if the three outputs of two Fanin runs hold the same lines (file names may
    differ), else "NO" and how they differ per output: lines only in ``a`` (of which copies of
    a line also in ``b``) and lines only in ``b``."""
    def lines(root: str, kind: str) -> Counter[bytes]:
        folder = os.path.join(root, kind)
        return Counter(line for name in sorted(os.listdir(folder)) if name.endswith(".jsonl")
                       for line in Path(folder, name).read_bytes().splitlines())
    differences = []
    for kind in (CLOSES, LATE, DEAD_LETTER):
        first, second = lines(a, kind), lines(b, kind)
        extra, missing = first - second, second - first
        if extra or missing:
            copies = sum(n for line, n in extra.items() if line in second)
            differences.append(f"{kind}: {sum(extra.values())} more ({copies} copies), "
                               f"{sum(missing.values())} fewer")
    return "yes" if not differences else f"NO ({'; '.join(differences)})"


def _flink() -> bool:
    """Whether ``fanin setup flink`` has built the job server and installed Flink."""
    try:
        from fanin.runners.toolchain import flink_home, flink_job_server_jar
    except ImportError:
        return False
    return os.path.isfile(flink_job_server_jar()) and os.path.isdir(flink_home())


_FLINK_ARGS = ["--runner=FlinkRunner", "--flink_master=[local]", "--environment_type=LOOPBACK"]


def _floor_cmd(path: str, *extra: str) -> list[str]:
    return [sys.executable, str(_ROOT / "bench" / "floor_join.py"), "--input", path,
            "--contracts", CONTRACTS_PATH, *extra]


def _runner_rows(tmp: str, label: str, args: list[str], path: str
                 ) -> dict[str, tuple[list[str], str | None]]:
    """The four whole processes of one runner's row: name -> (command, Fanin output folder)."""
    stream_args = args or ["--runner=BundleBasedDirectRunner"]
    naive_args = args or ["--runner=FnApiRunner"]
    folder = os.path.join(tmp, f"r-{label.split()[0].lower()}")
    return {
        "naive": (_naive_cmd(path, folder + "-n", *with_local_job_server(naive_args)), None),
        "bounded": (_fanin_cmd(path, folder + "-b", "--close-trigger", "watermark", *args),
                    folder + "-b"),
        "replay": (_fanin_cmd(path, folder + "-r", "--replay", "--close-trigger", "watermark",
                              *args), folder + "-r"),
        "floor": (_floor_cmd(path, *stream_args), None),
    }


def part_headline(tmp: str, joins: int, stream_joins: int, repeats: int,
                  flink_joins: int) -> None:
    """Whole processes, alternated. Table 1: bounded, Fanin vs the naive join, on the default
    runner and Prism. Table 2, per runner available (its own input size: Flink is slow to
    start): Fanin bounded vs the naive join, and the replay vs the bounded run (outputs
    compared) and vs the streaming floor (``bench/floor_join.py``)."""
    runners = [("default", [], ["--runner=FnApiRunner"])]
    if _prism():
        runners.append(("Prism", ["--runner=PrismRunner"], ["--runner=PrismRunner"]))
    path, lines = _simulate(tmp, joins)
    spath, slines = _simulate(tmp, stream_joins)
    spath = _sorted_by_event_time(spath)
    variants: dict[str, list[str]] = {}
    for label, fanin_args, naive_args in runners:
        variants[f"naive join, {label}"] = _naive_cmd(path, os.path.join(tmp, "hn"), *naive_args)
        variants[f"fanin bounded, {label}"] = _fanin_cmd(path, os.path.join(tmp, "hf"),
                                                         *fanin_args)
    # the default runner's close step in one process (no helpers: docs/runners.md)
    variants["fanin bounded one process, default"] = _fanin_cmd(
        path, os.path.join(tmp, "hf"), "--close-processes", "1")
    if _prism():  # run as its user would, no --runner: Beam's DirectRunner takes Prism
        variants["naive join, as written"] = _naive_cmd(path, os.path.join(tmp, "hn"))
    per_runner: list[tuple[str, int, dict[str, tuple[list[str], str | None]]]] = [
        ("default (FnApiRunner / BundleBasedDirectRunner)", slines,
         _runner_rows(tmp, "default", [], spath))]
    if _prism():
        per_runner.append(("PrismRunner", slines,
                           _runner_rows(tmp, "prism", ["--runner=PrismRunner"], spath)))
    if _flink() and flink_joins:
        fpath, flines = _simulate(tmp, flink_joins)
        per_runner.append(("FlinkRunner [local], LOOPBACK", flines,
                           _runner_rows(tmp, "flink", _FLINK_ARGS,
                                        _sorted_by_event_time(fpath))))
    for label, _, rows_of in per_runner:
        for kind, (cmd, _) in rows_of.items():
            variants[f"{label}: {kind}"] = cmd
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    _process([sys.executable, "-c", "import fanin.cli, fanin.pipelines.pipeline"])  # caches
    for _ in range(repeats):
        for name, cmd in variants.items():
            runs[name].append(_process(cmd))
    med = {name: (_median([r[0] for r in v]), _median([r[1] for r in v]), max(r[2] for r in v))
           for name, v in runs.items()}
    rows = []
    for label, _, _ in runners:
        naive, fanin = med[f"naive join, {label}"], med[f"fanin bounded, {label}"]
        rows.append([f"naive join ({label} runner)", lines, *naive[:2], lines / naive[0],
                     naive[2], "1.00 / 1.00"])
        rows.append([f"**fanin run ({label} runner)**", lines, *fanin[:2], lines / fanin[0],
                     fanin[2], f"**{naive[0] / fanin[0]:.2f}** / {naive[1] / fanin[1]:.2f}"])
        if label == "default":
            one = med["fanin bounded one process, default"]
            rows.append(["fanin run --close-processes 1 (default runner)", lines, *one[:2],
                         lines / one[0], one[2],
                         f"{naive[0] / one[0]:.2f} / {naive[1] / one[1]:.2f}"])
    if "naive join, as written" in med:
        naive, fanin = med["naive join, as written"], med["fanin bounded, default"]
        rows.append(["naive join (no --runner: Beam's DirectRunner, Prism here) vs fanin run "
                     "(default runner)", lines, *naive[:2], lines / naive[0], naive[2],
                     f"fanin: **{naive[0] / fanin[0]:.2f}** / {naive[1] / fanin[1]:.2f}"])
    _table(f"Headline: bounded, whole processes, {lines:,} messages ({joins:,} joins), median "
           f"of {repeats} alternated runs",
           ["program", "messages", "wall s", "CPU s", "messages/s (wall)", "peak RSS MiB",
            "speed vs naive join (wall / CPU)"], rows)
    rows = []
    for label, count, rows_of in per_runner:
        naive, bounded, replay, floor = (med[f"{label}: {kind}"]
                                         for kind in ("naive", "bounded", "replay", "floor"))
        same = _same_outputs(str(rows_of["replay"][1]), str(rows_of["bounded"][1]))
        rows.append([label, count, naive[0], bounded[0], replay[0], floor[0],
                     f"**{naive[0] / bounded[0]:.2f}** / {naive[1] / bounded[1]:.2f}",
                     f"**{replay[0] / bounded[0]:.2f}** / {replay[1] / bounded[1]:.2f}",
                     f"{replay[0] / floor[0]:.2f} / {replay[1] / floor[1]:.2f}",
                     same])
    _table(f"Headline per runner: sorted input ({stream_joins:,} joins; Flink {flink_joins:,}), "
           f"watermark trigger, whole processes (wall s), median of {repeats}",
           ["runner", "messages", "naive join s", "fanin bounded s", "fanin --replay s",
            "floor (replay + bag/timer) s", "bounded: speed vs naive (wall / CPU)",
            "replay: time vs bounded (wall / CPU)", "replay: time vs floor (wall / CPU)",
            "replay outputs = bounded"], rows)


# ------------------------------------------------------------------------- bounded variants
def _fanin_config(path: str, out: str, replay: bool = False,
                  defaults: JoinDefaults | None = None) -> RunConfig:
    return RunConfig(output=out, inputs=[path], contracts_path=CONTRACTS_PATH, replay=replay,
                     overwrite=True, defaults=defaults or JoinDefaults())


def _fanin_bounded(path: str, out: str) -> tuple[float, float]:
    """``run_pipeline`` wall time; its construction is timed by building an unrun copy."""
    config = _fanin_config(path, out)
    start = time.perf_counter()
    build(beam.Pipeline(options=_options(False)), config, _catalog())
    construction = time.perf_counter() - start
    start = time.perf_counter()
    run_pipeline(config, ["--runner=FnApiRunner"])
    return construction, time.perf_counter() - start - construction


def _records(line: str, contracts: frozenset[str]) -> Iterator[tuple[str, R.Record]]:
    record, _ = parse_message(line, _SOURCE, contracts)
    if record is not None:
        yield record[R.JOIN_ID], record


def _naive_close(element: tuple[str, Any]) -> dict[str, Any]:
    """The obvious reducer over a join sorted by event time; closes at first completeness."""
    join_id, grouped = element
    ordered = sorted(grouped, key=lambda r: r[R.TIME])
    join = NaiveJoin()
    closed_at = None
    for record in ordered:
        join.add(record)
        if join.required and join.complete():
            closed_at = record[R.TIME]
            break
    return {"join_id": join_id, "reason": "complete" if closed_at is not None else "timeout",
            "closed_at": None if closed_at is None else format_ms(closed_at),
            "messages": len(ordered),
            "values": {branch: rec[R.R_VALUE] for branch, rec in join.accepted.items()}}


def _naive_bounded(path: str, out: str) -> beam.Pipeline:
    contracts = frozenset(_catalog().contracts)
    p = beam.Pipeline(options=_options(False))
    (p
     | "Read" >> beam.io.ReadFromText(path)
     | "Parse" >> beam.FlatMap(_records, contracts).with_output_types(tuple[str, tuple])
     | "Group" >> beam.GroupByKey()
     | "Close" >> beam.Map(_naive_close)
     | "Dump" >> beam.Map(json.dumps)
     | "Write" >> beam.io.WriteToText(os.path.join(out, "closes"), ".jsonl"))
    return p


def _raw_text(line: str, contracts: frozenset[str]) -> str:
    record, dead = parse_message(line, _SOURCE, contracts)
    return record[R.RAW] if record is not None else dead["raw"]  # type: ignore[index]


def _floor_bounded(path: str, out: str) -> beam.Pipeline:
    contracts = frozenset(_catalog().contracts)
    p = beam.Pipeline(options=_options(False))
    (p
     | "Read" >> beam.io.ReadFromText(path)
     | "Parse" >> beam.Map(_raw_text, contracts)
     | "Write" >> beam.io.WriteToText(os.path.join(out, "floor"), ".jsonl"))
    return p


def part_bounded(tmp: str, messages: int, repeats: int) -> None:
    path, lines = _workload(tmp, messages)
    runs: dict[str, list[tuple[float, float]]] = {"fanin": [], "naive": [], "floor": []}
    for i in range(repeats):
        runs["fanin"].append(_fanin_bounded(path, os.path.join(tmp, f"fanin-{i}")))
        runs["naive"].append(_timed(functools.partial(
            _naive_bounded, path, os.path.join(tmp, f"n-{i}"))))
        runs["floor"].append(_timed(functools.partial(
            _floor_bounded, path, os.path.join(tmp, f"f-{i}"))))
    run = {k: _median([r for _, r in v]) for k, v in runs.items()}
    rows = [[name, lines, _median([c for c, _ in runs[name]]), run[name], lines / run[name],
             run["naive"] / run[name], run["floor"] / run[name]] for name in runs]
    _table(f"a. Bounded, FnApiRunner, {lines:,} messages, median of {repeats}",
           ["pipeline", "messages", "construct s", "run s", "messages/s", "vs naive (x)",
            "vs floor (x)"], rows)


# ------------------------------------------------------------------------- streaming
def _fanin_replay(path: str, out: str, defaults: JoinDefaults | None = None) -> beam.Pipeline:
    config = _fanin_config(path, out, replay=True, defaults=defaults)
    p = beam.Pipeline(options=_options(True))
    build(p, config, _catalog(config.defaults))
    return p


def _replayed(p: beam.Pipeline, path: str, catalog: Catalog) -> tuple[Any, int]:
    """The replay read and parse every streaming variant shares (``ParseMessages`` outputs),
    and the replay's ``end_ms`` (the join's ``input_end_ms``), as ``fanin run --replay``."""
    replay = replay_of(numbered_lines(path), catalog, 0.0)
    return p | "Read" >> replay, replay.end_ms


def _floor_replay(path: str) -> beam.Pipeline:
    p = beam.Pipeline(options=_options(True))
    floor_replay(p, path, _catalog())
    return p


def _fanin_join_replay(path: str) -> beam.Pipeline:
    """Fanin's stateful join alone: the same read and parse as the floor, then ``JoinRecords``
    (its closes, late and dead letters are computed and dropped, like the floor's output)."""
    catalog = _catalog()
    p = beam.Pipeline(options=_options(True))
    parsed, end_ms = _replayed(p, path, catalog)
    parsed.records | "Join" >> JoinRecords(catalog, streaming=True, input_end_ms=end_ms)
    return p


def part_stream(tmp: str, messages: int, repeats: int) -> None:
    path, lines = _workload(tmp, messages)
    runs: dict[str, list[tuple[float, float]]] = {"fanin": [], "fanin join": [], "floor": []}
    for i in range(repeats):
        runs["fanin"].append(_timed(functools.partial(
            _fanin_replay, path, os.path.join(tmp, f"rf-{i}"))))
        runs["fanin join"].append(_timed(functools.partial(_fanin_join_replay, path)))
        runs["floor"].append(_timed(functools.partial(_floor_replay, path)))
    run = {k: _median([r for _, r in v]) for k, v in runs.items()}
    rows = [[name, lines, _median([c for c, _ in runs[name]]), run[name], lines / run[name],
             run["floor"] / run[name]] for name in runs]
    _table(f"b. Streaming replay, BundleBasedDirectRunner, {lines:,} messages, "
           f"median of {repeats}",
           ["pipeline", "messages", "construct s", "run s", "messages/s", "vs floor (x)"], rows)


def part_growth(tmp: str, messages: int, stream_messages: int, repeats: int) -> None:
    rows = []
    for label, small_n, big_n, run_one in (
            ("bounded (FnApiRunner)", messages // 10, messages,
             _fanin_bounded),
            ("replay (BundleBasedDirectRunner)", stream_messages // 4, stream_messages,
             lambda p, o: _timed(functools.partial(_fanin_replay, p, o)))):
        small_path, small_lines = _workload(tmp, small_n, seed=2)
        big_path, big_lines = _workload(tmp, big_n, seed=2)
        small, big = [], []
        for i in range(repeats):
            small.append(run_one(small_path, os.path.join(tmp, f"gs-{i}"))[1])
            big.append(run_one(big_path, os.path.join(tmp, f"gb-{i}"))[1])
        rows.append([label, small_lines, _median(small), big_lines, _median(big),
                     big_lines / small_lines, _median(big) / _median(small)])
    _table(f"c. Growth of Fanin's run time, median of {repeats}",
           ["plan", "small n", "small run s", "big n", "big run s", "size ratio",
            "time ratio"], rows)


# ------------------------------------------------------------------------- memory
def _open_join_lines(joins: int, seed: int = 3, deadline_s: int = 30) -> Iterator[str]:
    """Per join: an open of 5 required branches and 2 ok receipts (one retried) - never
    complete; a join every 10 ms of event time, each open until ``deadline_s`` after it."""
    rnd = random.Random(seed)
    t0 = 1_767_225_600_000
    for j in range(joins):
        join_id, t = f"open-{j:07d}", t0 + j * 10
        yield json.dumps({"kind": "open", "join_id": join_id, "opened_at": format_ms(t),
                          "run_id": "run-1", "message_id": f"m-{j}-0",
                          "required": [f"part/{i:02d}" for i in range(5)],
                          "deadline_s": deadline_s})
        for i in range(2):
            yield json.dumps({"join_id": join_id, "branch": f"part/{i:02d}", "status": "ok",
                              "event_time": format_ms(t + 1 + i), "key": f"k{i}",
                              "value": {"score": rnd.random(), "n": i}, "run_id": "run-1",
                              "message_id": f"m-{j}-{i + 1}", "attempt": 1 + (i == 1)})


def _rss_mib() -> float:
    """Peak RSS of this process so far (getrusage), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_rss(pid: int | str = "self") -> int:
    """Current RSS of a process (/proc/PID/statm), bytes; OSError once it is gone."""
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _current_rss_mib() -> float:
    """Current RSS of this process, MiB."""
    return _current_rss() / 2**20


def _memory(joins: int) -> dict[str, float]:
    """Run in a fresh process: sizes of the streaming state and RSS of the reducers."""
    from fanin.core.reducer import JoinReducer

    catalog = _catalog()
    coder = coders.FastPrimitivesCoder()
    base, base_now = _rss_mib(), _current_rss_mib()
    by_join: dict[str, list[R.Record]] = {}
    source_path = "/data/traffic/sim-200000.jsonl"
    for number, line in enumerate(_open_join_lines(joins), start=1):
        record, dead = parse_message(line.encode(), {"kind": "file", "file": source_path,
                                                     "line": number}, catalog.contracts)
        assert record is not None, dead
        by_join.setdefault(record[R.JOIN_ID], []).append(record)
    after_records, records_now = _rss_mib(), _current_rss_mib()
    pickled, encoded, lean = [], [], []
    for recs in by_join.values():
        meta = [random.getrandbits(62), len(recs), -(2**62), recs[0][R.TIME] + 30_000, None]
        pickled.append(len(pickle.dumps((recs, meta), protocol=pickle.HIGHEST_PROTOCOL)))
        encoded.append(sum(len(coder.encode(r)) for r in recs) + len(coder.encode(meta)))
        lean.append(sum(len(coder.encode((*r[:R.RAW], None, None, *r[R.SOURCE + 1:])))
                        for r in recs))
    start = time.perf_counter()
    reducers = []
    for recs in by_join.values():
        reducer = JoinReducer(catalog)
        for record in recs:
            reducer.add(record)
        reducers.append(reducer)
    fold_s = time.perf_counter() - start
    after_reducers, reducers_now = _rss_mib(), _current_rss_mib()
    assert not any(r.complete() for r in reducers)
    return {"joins": len(by_join), "records": sum(len(v) for v in by_join.values()),
            "pickled": statistics.mean(pickled), "encoded": statistics.mean(encoded),
            "lean": statistics.mean(lean), "base": base, "after_records": after_records,
            "after_reducers": after_reducers, "fold_s": fold_s, "base_now": base_now,
            "records_now": records_now, "reducers_now": reducers_now}


def part_memory(joins: int = 100_000) -> None:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        m = pool.apply(_memory, (joins,))
    per_reducer_kib = (m["reducers_now"] - m["records_now"]) * 1024 / m["joins"]
    per_records_kib = (m["records_now"] - m["base_now"]) * 1024 / m["joins"]
    rows = [
        ["open joins (open + 2 receipts each)", int(m["joins"])],
        ["pickle.dumps((bag records, meta)) bytes / join", m["pickled"]],
        ["FastPrimitivesCoder bytes / join (records + meta)", m["encoded"]],
        ["  of which without RAW text and SOURCE dict", m["lean"]],
        ["state for all joins, MiB (coder)", m["encoded"] * m["joins"] / 2**20],
        ["peak RSS (getrusage) before / with records / + reducers, MiB",
         f"{m['base']:,.0f} / {m['after_records']:,.0f} / {m['after_reducers']:,.0f}"],
        ["current RSS (statm) before / with records / + reducers, MiB",
         f"{m['base_now']:,.0f} / {m['records_now']:,.0f} / {m['reducers_now']:,.0f}"],
        ["RSS per join: parsed records (3), KiB", per_records_kib],
        ["RSS per join: its JoinReducer, KiB", per_reducer_kib],
        ["fold into reducers, joins/s", m["joins"] / m["fold_s"]],
    ]
    _table("d. Memory per open join (fresh process)", ["measure", "value"], rows)


# ------------------------------------------------------------------------- trigger latency
_J_MSGS = beam.DoFn.StateParam(JoinDoFn.MSGS)
_J_META = beam.DoFn.StateParam(JoinDoFn.META)
_J_DECIDE = beam.DoFn.TimerParam(JoinDoFn.DECIDE)
_J_EXPIRE = beam.DoFn.TimerParam(JoinDoFn.EXPIRE)


def _stamped(outputs: Iterator[Any]) -> Iterator[Any]:
    """Pass the join's outputs through; note where the join was at each close it emits."""
    for out in outputs:
        if not isinstance(out, pvalue.TaggedOutput):
            _STAMPS.append((out["contract"], out["reason"], parse_rfc3339(out["closed_at"]),
                            _PROBE["lines"], _PROBE["max_seen"]))
        yield out


class ProbedJoinDoFn(JoinDoFn):
    """``JoinDoFn`` that counts the records it has received (and their largest event time)
    and stamps each close it emits with those two numbers (closes leave through ``_settle``,
    from ``process`` and from the decide timer alike)."""

    def process(self, element: tuple[str, R.Record], msgs: Any = _J_MSGS, meta: Any = _J_META,
                decide_timer: Any = _J_DECIDE, expire_timer: Any = _J_EXPIRE
                ) -> Iterator[Any]:
        _PROBE["lines"] += 1
        _PROBE["max_seen"] = max(_PROBE["max_seen"], element[1][R.TIME])
        return super().process(element, msgs, meta, decide_timer, expire_timer)

    def _settle(self, *args: Any) -> Iterator[Any]:
        return _stamped(super()._settle(*args))


def _probes() -> Any:
    """This file as an importable module (pickled by reference: shared probe state)."""
    return importlib.import_module(Path(__file__).stem)


def _trigger_replay(path: str, out: str, trigger: str) -> beam.Pipeline:
    """The replay pipeline of ``build`` (same composites), its join DoFn probed."""
    catalog = _catalog(JoinDefaults(close_trigger=trigger))  # type: ignore[arg-type]
    p = beam.Pipeline(options=_options(True))
    parsed, end_ms = _replayed(p, path, catalog)
    joined = parsed.records | "Join" >> beam.ParDo(
        _probes().ProbedJoinDoFn(catalog, 100_000, input_end_ms=end_ms)).with_input_types(
        tuple[str, tuple]).with_outputs(LATE, DEAD_LETTER, main=CLOSES)
    outputs = {CLOSES: joined[CLOSES], LATE: joined[LATE],
               DEAD_LETTER: (joined[DEAD_LETTER], parsed[DEAD_LETTER])
               | "MergeDeadLetters" >> beam.Flatten()}
    for kind, pcoll in outputs.items():
        pcoll | f"Write/{kind}" >> WriteOutput(os.path.join(out, kind), kind, ("jsonl",), True)
    return p


def _quantile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))]) if ordered else 0.0


def _open_joins_input(path: str, joins: int) -> int:
    """The ``memory`` part's open joins (``_open_join_lines``) as a file, each open for an hour
    of event time: longer than the input spans (up to 360,000 joins), so in a replay every
    join is open until the final watermark. Returns the file's bytes."""
    with open(path, "w") as out:
        out.writelines(line + "\n" for line in _open_join_lines(joins, deadline_s=3600))
    return os.path.getsize(path)


def _process_kind(pid: int) -> str | None:
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    return "java" if name == "java" else "prism" if "prism" in name or \
        name.startswith("apache_beam") else "python"


def _tree_rss(root: int) -> dict[str, int]:
    """RSS (bytes) of the process tree under ``root`` now, summed by kind of process."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    found: dict[str, int] = {}
    for pid in tree:
        kind = _process_kind(pid)
        try:
            rss = _current_rss(pid)
        except (OSError, IndexError):
            continue
        if kind is not None:
            found[kind] = found.get(kind, 0) + rss
    return found


def _peak_rss_by_kind(cmd: list[str], log: str) -> dict[str, int]:
    """Run ``cmd`` to the end (its output to ``log``); the peak RSS of each kind of process in
    its tree, sampled every 0.1 s (a sampled peak: a spike shorter than that can be missed)."""
    peaks: dict[str, int] = {}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=_ROOT, env=_USER_ENV, stdout=out,
                                stderr=subprocess.STDOUT)
        while proc.poll() is None:
            for kind, rss in _tree_rss(proc.pid).items():
                peaks[kind] = max(peaks.get(kind, 0), rss)
            time.sleep(0.1)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}): see {log}")
    return peaks


def part_state(tmp: str, joins: int, base: int = 1_000) -> None:
    """Memory per open join in the streaming state, per runner set up (see the docstring)."""
    runners = [("default (BundleBasedDirectRunner)", [], "python")]
    if _prism():
        runners.append(("PrismRunner", ["--runner=PrismRunner"], "prism"))
    if _flink():
        runners.append(("FlinkRunner [local], LOOPBACK", _FLINK_ARGS, "java"))
    sizes, rows = {}, []
    for n in (base, joins):
        sizes[n] = _open_joins_input(os.path.join(tmp, f"open-{n}.jsonl"), n)
    for label, args, holder in runners:
        peaks = {}
        for n in (base, joins):
            cmd = [str(_BIN / "fanin"), "run", "--input", os.path.join(tmp, f"open-{n}.jsonl"),
                   "--contracts", CONTRACTS_PATH, "--output", os.path.join(tmp, f"state-out-{n}"),
                   "--overwrite", "--replay", "--close-trigger", "watermark", *args]
            peaks[n] = _peak_rss_by_kind(cmd, os.path.join(tmp, f"state-{holder}-{n}.log"))
        per_join = {kind: (peaks[joins].get(kind, 0) - peaks[base].get(kind, 0))
                    / (joins - base) for kind in peaks[joins]}
        rows.append([label, holder, peaks[base].get(holder, 0) / 2**20,
                     peaks[joins].get(holder, 0) / 2**20, round(per_join.get(holder, 0)),
                     round(sum(per_join.values())),
                     round((sizes[joins] - sizes[base]) / (joins - base))])
    _table(f"Memory per open join in the streaming state: `fanin run --replay` of {base:,} and "
           f"{joins:,} joins (the `memory` part's: an open and 2 of 5 required receipts each), "
           "all open until the replay ends; sampled peak RSS",
           ["runner", "state held by", f"peak MiB, {base:,} joins", f"peak MiB, {joins:,} joins",
            "bytes per open join (that process)", "bytes per open join (all processes)",
            "input bytes per join (the replay's TestStream holds them)"], rows)


def part_trigger(tmp: str, messages: int, repeats: int) -> None:
    path, lines = _workload(tmp, messages)
    probes = _probes()
    runs: dict[str, list[float]] = {"eager": [], "watermark": []}
    lags: dict[str, dict[str, list[int]]] = {}
    for i in range(repeats):
        for trigger in runs:
            probes._PROBE.update(lines=0, max_seen=-(2**62))
            probes._STAMPS.clear()
            runs[trigger].append(_timed(functools.partial(
                _trigger_replay, path, os.path.join(tmp, f"t{trigger}-{i}"), trigger))[1])
            by_reason: dict[str, list[int]] = {"complete": [], "deadline": []}
            for contract, reason, closed_at, _, max_seen in probes._STAMPS:
                if contract != "ensemble":  # the ensemble contract always uses watermark
                    by_reason["complete" if reason == "complete" else "deadline"].append(
                        max_seen - closed_at)
            lags[trigger] = by_reason
    rows = []
    for trigger, times in runs.items():
        run = _median(times)
        rows.append([trigger, lines, run, lines / run, len(lags[trigger]["complete"]),
                     _quantile(lags[trigger]["complete"], 0.5),
                     _quantile(lags[trigger]["complete"], 0.95),
                     len(lags[trigger]["deadline"]),
                     _quantile(lags[trigger]["deadline"], 0.5),
                     _quantile(lags[trigger]["deadline"], 0.95)])
    _table(f"e. Close trigger, replay on BundleBasedDirectRunner, {lines:,} messages, "
           f"run time median of {repeats}, latency from the last run (ms of event time)",
           ["trigger", "messages", "run s", "messages/s", "complete closes", "lag p50",
            "lag p95", "deadline closes", "lag p50", "lag p95"], rows)


# ------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000,
                        help="bounded workload size (growth: this and a tenth of it)")
    parser.add_argument("--stream-messages", type=int, default=20_000,
                        help="replay workload size (growth: this and a quarter of it)")
    parser.add_argument("--open-joins", type=int, default=100_000)
    parser.add_argument("--state-joins", type=int, default=20_000,
                        help="state: open joins of the large replay (and 1,000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--joins", type=int, default=29_000,
                        help="headline: joins of the bounded input (29,000: ~200,000 lines)")
    parser.add_argument("--stream-joins", type=int, default=3_000,
                        help="headline: joins of the replay input (3,000: ~20,800 lines)")
    parser.add_argument("--flink-joins", type=int, default=300,
                        help="headline: joins of Flink's input, when `fanin setup flink` ran "
                             "(Flink takes ~30 s to start a job; 0: no Flink row)")
    parser.add_argument("--quick", action="store_true",
                        help="what `make bench` runs: the headline (replay of 1,000 joins), "
                             "then memory and bounded at half size")
    parser.add_argument("--only", choices=PARTS, action="append",
                        help="run only this part (repeatable)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.state_joins <= 1_000 or min(
            args.messages, args.stream_messages, args.open_joins, args.joins,
            args.stream_joins) < 1 or args.flink_joins < 0:
        parser.error("--repeats and the sizes must be >= 1 (--flink-joins >= 0), "
                     "--state-joins > 1,000 (the state part's smaller replay)")
    parts = args.only or list(PARTS)
    if args.quick:  # about 10 minutes on 2 idle cores (the full headline alone: ~16)
        parts = args.only or ["headline", "memory", "bounded"]
        args.messages, args.open_joins = args.messages // 2, args.open_joins // 2
        args.stream_joins = min(args.stream_joins, 1_000)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fanin-bench-") as tmp:
        if "headline" in parts:
            part_headline(tmp, args.joins, args.stream_joins, args.repeats, args.flink_joins)
        if "memory" in parts:  # first: the child's peak RSS starts at the parent's (fork+exec)
            part_memory(args.open_joins)
        if "state" in parts:
            part_state(tmp, args.state_joins)
        if "bounded" in parts:
            part_bounded(tmp, args.messages, args.repeats)
        if "stream" in parts:
            part_stream(tmp, args.stream_messages, args.repeats)
        if "growth" in parts:
            part_growth(tmp, args.messages, args.stream_messages, args.repeats)
        if "trigger" in parts:
            part_trigger(tmp, args.stream_messages, args.repeats)
    print(f"\n(total {time.perf_counter() - started:,.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
