"""A replay split across processes (``fanin.pipelines.split_replay``): the plan gives each
partition its joins' lines whole, in the events and with the watermark moves of the whole
stream; a split replay writes the files of one process byte for byte (2 and 3 partitions,
shards, Parquet, input out of order); a partition whose helper dies or fails is replayed by
the run itself, reported; ``--close-processes`` applies to a replay on the default runner
that writes files only. Runs are fresh interpreters (``support.close_runs``)."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from apache_beam.testing.test_stream import ElementEvent, WatermarkEvent
from support.child_env import file_size_limited, same_code_env

from fanin.contracts.catalog import load_contracts
from fanin.fleet.simulate import CONTRACTS_PATH, write_simulation
from fanin.pipelines.pipeline import RunConfig, catalog_for, replay_of
from fanin.pipelines.runner_choice import AUTO_CLOSE_PROCESSES, replay_processes
from fanin.transforms import write
from fanin.transforms.read import numbered_lines
from fanin.transforms.replay import MessageScan, partition_of
from fanin.transforms.write import finalize_spills, new_token

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fleet traffic of 300 joins, in the simulator's order (out of event-time order: lines
    arrive behind the watermark, late lines, many events), with lines the parse refuses."""
    path = tmp_path_factory.mktemp("split") / "fleet.jsonl"
    write_simulation(path, joins=300, seed=5)
    with path.open("a", encoding="utf-8") as handle:
        handle.write('not json\n{"join_id": "x"}\n{"kind": "open"}\n')
    return path


def _events(stream: Any) -> list[tuple[str, Any]]:
    """A partition's stream: ``("lines", [(path, index among the partition's lines)...])``
    per event of lines, ``("watermark", ms)`` per move."""
    events: list[tuple[str, Any]] = []
    for event in stream._events:
        if isinstance(event, ElementEvent):
            lines = [(tv.value[0], tv.value[1][0] + k) for tv in event.timestamped_values
                     for k in range(len(tv.value[1][1]) // 8)]
            events.append(("lines", lines))
        elif isinstance(event, WatermarkEvent):
            events.append(("watermark", event.new_watermark.micros // 1000))
    return events


def _by_line(events: list[tuple[str, Any]], numbers: list[int]
             ) -> dict[int, tuple[int, int]]:
    """File line number -> (watermark moves before it, events before it), for a stream whose
    n-th line is the file's line ``numbers[n]``."""
    placed: dict[int, tuple[int, int]] = {}
    moves = seen = 0
    for n, (kind, value) in enumerate(events):
        if kind == "watermark":
            moves += 1
            continue
        for _, index in value:
            placed[numbers[index]] = (moves, n)
        seen += 1
    return placed


def test_each_partition_replays_its_joins_lines_with_the_whole_streams_watermark(
        traffic: Path) -> None:
    config = RunConfig(output="o", inputs=[str(traffic)], contracts_path=CONTRACTS_PATH,
                       replay=True, max_disorder_s=2.0)
    catalog = catalog_for(config)
    whole = replay_of(numbered_lines(str(traffic)), catalog, 2.0)
    split = replay_of(numbered_lines(str(traffic)), catalog, 2.0, partitions=3)
    scan = MessageScan(frozenset(load_contracts(CONTRACTS_PATH)), config.max_bytes)
    joins = [scan(line)[2] for line, _ in numbered_lines(str(traffic))]
    assert whole.events > 10 and split.events == whole.events  # disorder: many events
    assert split.end_ms == whole.end_ms
    every = _events(whole._streams[0])
    one = _by_line(every, list(range(len(joins))))
    moves = [value for kind, value in every if kind == "watermark"]
    covered: list[int] = []
    for part in range(3):
        events = _events(split._streams[part])
        assert [value for kind, value in events if kind == "watermark"] == moves
        numbers = [n for n, join_id in enumerate(joins) if partition_of(join_id, 3) == part]
        assert numbers  # every partition has joins here
        placed = _by_line(events, numbers)
        assert sorted(placed) == numbers  # the partition's lines, each once, in file order
        covered += numbers
        for n in numbers:  # behind the same watermark moves as in the whole stream
            assert placed[n][0] == one[n][0]
        for a, b in itertools.pairwise(numbers):  # in one event here iff in the whole stream
            assert (placed[a][1] == placed[b][1]) == (one[a][1] == one[b][1])
    assert sorted(covered) == list(range(len(joins)))
    assert None in joins and partition_of(None, 3) == 0  # refused lines: partition 0


def _run(path: Path, out: Path, processes: int, **settings: Any) -> dict[str, Any]:
    """One replay in a fresh interpreter (``support.close_runs``)."""
    config = {"replay": True, **settings.pop("config", {})}
    done = subprocess.run([sys.executable, "-m", "support.close_runs", json.dumps(
        {"input": str(path), "output": str(out), "processes": processes, "config": config,
         **settings})],
        capture_output=True, text=True, timeout=300, env=same_code_env(
            PYTHONPATH=os.pathsep.join([same_code_env()["PYTHONPATH"], str(TESTS)])))
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {**found, "stderr": done.stderr}


@pytest.mark.parametrize("config", [
    {"max_disorder_s": 2.0},
    {"max_disorder_s": 600.0, "shards": 3, "formats": ["jsonl", "parquet"]},
])
def test_a_split_replay_writes_the_files_of_one_process(
        traffic: Path, tmp_path: Path, config: dict[str, Any]) -> None:
    one = _run(traffic, tmp_path / "one", 1, config=config)
    assert one["parts"] == [] and sum(len(files) for files in one["files"].values()) >= 3
    for processes in (2, 3):
        split = _run(traffic, tmp_path / f"split{processes}", processes, config=config)
        assert split["files"] == one["files"]  # names (but the job token) and bytes
        assert sorted(split["parts"]) == list(range(1, processes))
        assert split["parts_undone"] == [] and split["failures"] == []
        assert "failed" not in split["stderr"]


@pytest.mark.parametrize("fail, reason", [
    ({"die_on": 1}, "it exited with status 9"),
    ({"raise_on": 2}, "MemoryError: injected"),
])
def test_a_partition_whose_helper_fails_is_replayed_by_the_run(
        traffic: Path, tmp_path: Path, fail: dict[str, int], reason: str) -> None:
    one = _run(traffic, tmp_path / "one", 1, config={"max_disorder_s": 2.0})
    failing = _run(traffic, tmp_path / "failing", 3, config={"max_disorder_s": 2.0},
                   fail={**fail, "step": "replay"})
    assert failing["files"] == one["files"]
    assert failing["parts_undone"] == [fail.get("die_on") or fail["raise_on"]]
    assert failing["stderr"].count(
        f"fanin: a process of the split replay failed ({reason}); this process replays its "
        "joins itself") == 1
    leftovers = [p for p in (tmp_path / "failing").rglob(".*") if p.is_file()]
    assert leftovers == []  # the failed helper's temporary files are gone too


def test_close_processes_splits_a_replay_on_the_default_runner_that_writes_files_only(
        ) -> None:
    replay = RunConfig(output="o", inputs=["i"], replay=True)
    cores = min(AUTO_CLOSE_PROCESSES, len(os.sched_getaffinity(0)))
    assert replay_processes(replay, "BundleBasedDirectRunner") == cores
    given = RunConfig(output="o", inputs=["i"], replay=True, close_processes=3)
    assert replay_processes(given, "BundleBasedDirectRunner") == 3
    for runner in ("PrismRunner", "FlinkRunner", "DirectRunner"):
        assert replay_processes(given, runner) == 1
    published = RunConfig(output="o", inputs=["i"], replay=True, close_processes=3,
                          topics={"closes": "projects/p/topics/t"})
    assert replay_processes(published, "BundleBasedDirectRunner") == 1
    assert replay_processes(RunConfig(output="o", inputs=["i"], close_processes=3),
                            "BundleBasedDirectRunner") == 1  # bounded: close_processes


def _plan(path: Path, **settings: Any) -> dict[str, Any]:
    """A replay's plan in a fresh interpreter (``support.plan_runs``)."""
    done = subprocess.run([sys.executable, "-m", "support.plan_runs", json.dumps(
        {"input": str(path), **settings})], capture_output=True, text=True, timeout=300,
        env=same_code_env(PYTHONPATH=os.pathsep.join([same_code_env()["PYTHONPATH"],
                                                       str(TESTS)])))
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_plan_parsed_by_helpers_is_the_plan_of_one_process(traffic: Path,
                                                               tmp_path: Path) -> None:
    long = tmp_path / "long.jsonl"  # a line over --max-bytes: its chunk is parsed here
    lines = traffic.read_text(encoding="utf-8").splitlines()
    lines.insert(700, json.dumps({"join_id": "big", "branch": "a", "status": "ok",
                                  "event_time": "2026-01-01T00:00:00Z", "value": "x" * 5000}))
    long.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for path, partitions in ((traffic, 1), (long, 3)):
        settings = {"partitions": partitions, "chunk": 97, "max_bytes": 4096,
                    "max_disorder_s": 2.0}
        one = _plan(path, processes=1, **settings)
        assert one["chunks"] == 0 and one["events"] > 10
        for processes in (2, 3):
            helped = _plan(path, processes=processes, **settings)
            assert helped["plan"] == one["plan"] and helped["events"] == one["events"]
            assert helped["chunks"] > 5 and helped["undone"] == 0 and not helped["failures"]
    # fewer lines than a chunk: the plan parses them itself, forking nothing
    assert _plan(traffic, processes=3, partitions=1)["chunks"] == 0
    failing = _plan(long, processes=3, raise_on=2, **settings)  # each helper's 2nd chunk
    assert failing["plan"] == one["plan"] and failing["undone"] == 2
    assert failing["failures"] == 2 * ["fanin: a helper of the replay's plan failed "
                                       "(MemoryError: injected); the plan parses its lines "
                                       "itself"]


def test_a_merge_the_disk_refuses_is_the_one_line_of_one_process(traffic: Path,
                                                                 tmp_path: Path) -> None:
    """Files limited to 3/4 of the closes file: each job's own files fit, the closes file
    does not; the run fails in the files' finalize with one process, and in the run's merge
    after a split. Both say it in the same line (the step named), with no traceback."""
    _run(traffic, tmp_path / "whole", 1, config={"max_disorder_s": 2.0})
    size = sum(p.stat().st_size for p in (tmp_path / "whole" / "closes").iterdir())
    said = []
    for processes in (1, 2):
        done = subprocess.run(file_size_limited([
            str(Path(sys.executable).with_name("fanin")), "run", "--input", str(traffic),
            "--contracts", CONTRACTS_PATH, "--output", str(tmp_path / f"out{processes}"),
            "--replay", "--max-disorder-s", "2", "--close-processes", str(processes)],
            size * 3 // 4), capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 1, done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        last = done.stderr.strip().splitlines()[-1]
        said.append(re.sub(r"out\d/closes/\S+'", "FILE'", last))
    assert said[0] == said[1]
    assert re.fullmatch(r"fanin: error: the job failed reading or writing files: cannot write "
                        r"'\S+FILE': File too large \[while running 'Write/closes/Finalize'\]",
                        said[0]), said[0]


def test_the_finalize_deletes_what_a_process_killed_while_writing_left(tmp_path: Path) -> None:
    """A split replay's helper killed while it wrote a temporary file leaves atomic_write's
    own temporary file of it (``.<name>.tmp-...``); the run's finalize deletes it too."""
    folder = tmp_path / "closes"
    folder.mkdir()
    token = new_token()
    spilled = []
    for lines in (["a\n", "c\n"], ["b\n"]):
        path = write._temp_file(str(folder), "closes", token, 0)
        Path(path).write_text("".join(lines), encoding="utf-8")
        spilled.append((0, path))
    stray = folder / f".{Path(write._temp_file(str(folder), 'closes', token, 0)).name}.tmp-0f"
    stray.write_text("a\n", encoding="utf-8")
    written = finalize_spills(str(folder), "closes", ["jsonl"], token, spilled)
    assert [Path(p).read_text(encoding="utf-8") for p in written] == ["a\nb\nc\n"]
    assert sorted(p.name for p in folder.iterdir()) == [Path(written[0]).name]
