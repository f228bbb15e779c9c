"""The bounded close step with helper processes (``--close-processes``, CloseGroups' helpers):
the same files and counters as one process, also when a helper dies or fails mid-run (its
failure reported); the option applies only where it does something, and its default follows
the cores. Each run is a fresh interpreter (``support.close_runs``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from support.builders import nested, stack_hungry_schema
from support.child_env import same_code_env

from fanin.cli import main
from fanin.fleet.simulate import CONTRACTS_PATH, write_simulation
from fanin.pipelines.pipeline import RunConfig
from fanin.pipelines.runner_choice import AUTO_CLOSE_PROCESSES, close_processes
from fanin.transforms.join_bounded import CloseGroups

KINDS = ("closes", "late", "dead_letter")
HOT = "hot-join"
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fleet traffic of 400 joins (more than a batch: helpers are forked), bad lines, and a
    hot join of more grouped values than a batch takes (decided by the close step itself)."""
    path = tmp_path_factory.mktemp("traffic") / "fleet.jsonl"
    write_simulation(path, joins=400, seed=11)
    extra = ['{"kind": "open", "join_id": "hot-join", "opened_at": "2026-01-01T00:00:00Z", '
             '"required": ["a"]}']
    extra += [json.dumps({"join_id": HOT, "branch": f"b{n % 7}", "status": "ok",
                          "event_time": f"2026-01-01T00:00:{n % 50:02d}Z", "value": n})
              for n in range(CloseGroups._SENT_VALUES + 50)]
    extra += ["not json", '{"join_id": "x"}']
    with path.open("a", encoding="utf-8") as handle:
        handle.write("\n".join(extra) + "\n")
    return path


def _run(path: Path, out: Path, processes: int, **settings: Any) -> dict[str, Any]:
    """One bounded run in a fresh interpreter (``support.close_runs``): its files' hashes,
    counters and what went to the helpers."""
    done = subprocess.run([sys.executable, "-m", "support.close_runs", json.dumps(
        {"input": str(path), "output": str(out), "processes": processes, **settings})],
        capture_output=True, text=True, timeout=300, env=same_code_env(
            PYTHONPATH=os.pathsep.join([same_code_env()["PYTHONPATH"], str(TESTS)])))
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {**found, "stderr": done.stderr}


def _same(one: dict[str, Any], other: dict[str, Any]) -> bool:
    return (one["files"], one["counters"]) == (other["files"], other["counters"])


@pytest.mark.parametrize("config", [{}, {"max_messages_per_join": 3}])
def test_helpers_give_the_files_and_counters_of_one_process(
        traffic: Path, tmp_path: Path, config: dict[str, int]) -> None:
    one = _run(traffic, tmp_path / "one", 1, config=config)
    three = _run(traffic, tmp_path / "three", 3, config=config)
    assert _same(three, one)
    assert all(one["files"][kind] for kind in KINDS)
    assert one["sent"] == []
    sent = three["sent"]
    assert len(sent) >= 2 and sum(sent) < 401 and not three["undone"]  # helpers decided some
    assert three["chunks"] == []  # one chunk of messages (a file's last): keyed by the step
    # the helpers ended with the close step's bundle, before the writes' finalize (their
    # memory and descriptors: a run under a low open-file limit failed in its final write)
    assert three["ends_at_finalize"] == [0, 0, 0]
    if config:  # the per-join limit decided in helpers too
        assert one["counters"]["dead_letter.join_too_large"] > 100


def test_batches_are_bounded_in_bytes_and_large_joins_stay_in_the_close_step(
        traffic: Path, tmp_path: Path) -> None:
    one = _run(traffic, tmp_path / "one", 1)
    two = _run(traffic, tmp_path / "two", 2,
               batch={"_BATCH_BYTES": 8_000, "_SENT_BYTES": 2_000})
    assert _same(two, one)
    sent = two["sent"]
    assert len(sent) >= 10 and max(sent) < 128 and not two["undone"]
    assert sum(sent) < 350  # the joins over 2,000 bytes were decided by the close step


def test_a_schema_check_deep_in_the_stack_gives_the_same_closes_in_a_helper(
        tmp_path: Path) -> None:
    """A value whose check nearly exhausts Python's stack: a helper runs it deeper in its
    stack (it was forked from inside the close step) and gave timeouts where one process
    gave complete closes."""
    schema = stack_hungry_schema()
    contracts = tmp_path / "deep.yaml"
    contracts.write_text("contracts:\n  - name: deep\n    required: [v]\n    schemas:\n"
                         f"      v: {json.dumps(schema)}\n", encoding="utf-8")
    traffic = tmp_path / "deep.jsonl"
    lines = []
    for n in range(300):
        value = nested(30 + n % 20)  # some pass, some run out of stack
        lines.append(json.dumps({"kind": "open", "join_id": f"d-{n}", "contract": "deep",
                                 "opened_at": "2026-01-01T00:00:00Z"}))
        lines.append(json.dumps({"join_id": f"d-{n}", "branch": "v", "status": "ok",
                                 "event_time": "2026-01-01T00:00:01Z", "value": value}))
    traffic.write_text("\n".join(lines) + "\n", encoding="utf-8")
    one = _run(traffic, tmp_path / "one", 1, contracts=str(contracts))
    two = _run(traffic, tmp_path / "two", 2, contracts=str(contracts))
    assert _same(two, one) and two["sent"] and not two["undone"]
    assert one["counters"]["closes.complete"] > 50 and one["counters"]["closes.timeout"] > 50


@pytest.mark.parametrize("fail, reason", [({"die_on": 2}, "it exited with status 9"),
                                          ({"raise_on": 2}, "MemoryError: injected")])
def test_a_helper_that_dies_or_fails_mid_run_changes_no_output(
        traffic: Path, tmp_path: Path, fail: dict[str, int], reason: str) -> None:
    one = _run(traffic, tmp_path / "one", 1)
    # each of the two helpers fails on its second batch (of ~50)
    failing = _run(traffic, tmp_path / "two", 3, batch={"_BATCH_JOINS": 8}, fail=fail)
    assert _same(failing, one)
    assert len(failing["undone"]) == 2 and len(failing["sent"]) >= 4
    assert failing["failures"] == [reason, reason]
    warning = f"fanin: a helper of the close step failed ({reason}); the close step decides"
    assert failing["stderr"].count(warning) == 2


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 joins, each an open and one receipt line written 5 times, the joins interleaved:
    a join's copies are ~60 lines apart, so chunks of 25 messages split them."""
    path = tmp_path_factory.mktemp("repeated") / "repeated.jsonl"
    joins = [f"r-{n}" for n in range(60)]
    lines = [json.dumps({"kind": "open", "join_id": j, "opened_at": "2026-01-01T00:00:00Z",
                         "required": ["a"]}) for j in joins]
    for _ in range(5):
        lines += [json.dumps({"join_id": j, "branch": "a", "status": "ok", "value": 1,
                              "event_time": "2026-01-01T00:00:01Z"}) for j in joins]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _refused_lines(out: Path) -> dict[str, list[int]]:
    """The line numbers of the ``join_too_large`` dead letters, by join."""
    refused: dict[str, list[int]] = {}
    for file in (out / "dead_letter").glob("*.jsonl"):
        for line in file.read_text(encoding="utf-8").splitlines():
            letter = json.loads(line)
            if letter["error"] == "join_too_large":
                join_id = json.loads(letter["raw"])["join_id"]
                refused.setdefault(join_id, []).append(letter["source"]["line"])
    return refused


def test_key_helpers_keep_each_joins_messages_in_read_order(repeated: Path,
                                                            tmp_path: Path) -> None:
    """A join of more messages than its limit keeps its first lines (docs/spec.md §4: equal
    messages in file order) whichever process keyed the chunks they were read in."""
    settings = {"config": {"max_messages_per_join": 3}, "chunk": {"CHUNK_MESSAGES": 25}}
    one = _run(repeated, tmp_path / "one", 1, **settings)
    three = _run(repeated, tmp_path / "three", 3, **settings)
    assert _same(three, one)
    assert len(three["chunks"]) >= 4 and not three["chunks_undone"] and one["chunks"] == []
    # the open and the first two copies are held; the last three copies are refused
    refused = _refused_lines(tmp_path / "three")
    assert sorted(refused) == sorted(f"r-{n}" for n in range(60))
    for n in range(60):
        assert sorted(refused[f"r-{n}"]) == [61 + n + 60 * copy for copy in (2, 3, 4)]


def test_a_line_longer_than_max_bytes_states_its_size_whoever_keys_its_chunk(
        tmp_path: Path) -> None:
    """A long line reaches the key step as its first bytes and its size (``LongLine``); its
    ``too_large`` dead letter states the line's size with helpers as without."""
    path = tmp_path / "long.jsonl"
    lines = [json.dumps({"join_id": f"l-{n}", "branch": "a", "status": "ok",
                         "event_time": "2026-01-01T00:00:01Z",
                         "value": "x" * (3_000 + n if n % 50 == 0 else 1)})
             for n in range(200)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    settings = {"config": {"max_bytes": 1_000}, "chunk": {"CHUNK_MESSAGES": 20}}
    one = _run(path, tmp_path / "one", 1, **settings)
    three = _run(path, tmp_path / "three", 3, **settings)
    assert _same(three, one) and three["chunks"]  # helpers keyed the chunks of short lines
    letters = [json.loads(line) for file in (tmp_path / "three" / "dead_letter").glob("*.jsonl")
               for line in file.read_text(encoding="utf-8").splitlines()]
    assert sorted(letter["detail"] for letter in letters if letter["error"] == "too_large") == \
        sorted(f"{len(lines[n])} bytes > limit 1000" for n in range(0, 200, 50))


@pytest.mark.parametrize("fail, reason", [({"die_on": 2}, "it exited with status 9"),
                                          ({"raise_on": 2}, "MemoryError: injected")])
def test_a_key_helper_that_dies_or_fails_mid_run_changes_no_output(
        traffic: Path, tmp_path: Path, fail: dict[str, int], reason: str) -> None:
    one = _run(traffic, tmp_path / "one", 1)
    # each of the two key helpers fails on its second chunk (of ~15)
    failing = _run(traffic, tmp_path / "three", 3, chunk={"CHUNK_MESSAGES": 100},
                   fail={**fail, "step": "key"})
    assert _same(failing, one)
    assert failing["chunks_undone"] == [100, 100] and len(failing["chunks"]) >= 4
    assert failing["failures"] == [reason, reason]
    warning = f"fanin: a helper of the key step failed ({reason}); the key step keys its"
    assert failing["stderr"].count(warning) == 2


def test_close_processes_defaults_to_the_cores_on_the_local_bounded_runner_only() -> None:
    bounded = RunConfig(output="o", inputs=["i"])
    local = PipelineOptions([])
    cores = min(AUTO_CLOSE_PROCESSES, len(os.sched_getaffinity(0)))
    assert close_processes(local, bounded, "FnApiRunner") == cores
    assert close_processes(local, RunConfig(output="o", inputs=["i"], close_processes=3),
                           "FnApiRunner") == 3
    for runner in ("PrismRunner", "FlinkRunner", "DataflowRunner", "DirectRunner"):
        assert close_processes(local, bounded, runner) == 1
    assert close_processes(local, RunConfig(output="o", inputs=["i"], replay=True),
                           "BundleBasedDirectRunner") == 1
    threads = PipelineOptions(["--direct_num_workers=2", "--direct_running_mode=multi_threading"])
    assert close_processes(threads, bounded, "FnApiRunner") == 1


@pytest.mark.parametrize("args, message", [
    (["--close-processes", "0"], "--close-processes must be from 1 to 64"),
    (["--close-processes", "65"], "--close-processes must be from 1 to 64"),
    (["--close-processes", "2", "--replay", "--closes-topic",
      "projects/my-project/topics/closes"],
     "and to a replay on BundleBasedDirectRunner (the default) that writes files only"),
    (["--close-processes", "2", "--runner", "PrismRunner"],
     "--close-processes applies to a bounded run"),
    (["--close-processes", "1", "--direct_num_workers", "2"],
     "--close-processes applies to a bounded run"),
    (["--close-processes", "2", "--dry-run", "{tmp}/graph.json", "--runner", "DataflowRunner",
      "--project", "my-project", "--region", "us-central1", "--temp_location",
      "gs://my-bucket/tmp"], "--close-processes applies to a bounded run"),
])
def test_close_processes_where_it_does_nothing_is_one_line_and_exit_2(
        traffic: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
        message: str) -> None:
    code = main(["run", "--input", str(traffic), "--contracts", CONTRACTS_PATH,
                 "--output", str(tmp_path / "out"), *(a.format(tmp=tmp_path) for a in args)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("fanin: error: ") and message in err and "\n" not in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "graph.json").exists()
