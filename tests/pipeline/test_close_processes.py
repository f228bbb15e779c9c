"""The bounded close step with helper processes (``--close-processes``, CloseGroups' helpers):
the same files and counters as one process, also when a helper dies or fails mid-run; the
option applies only where it does something, and its default follows the cores."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from fanin.cli import main
from fanin.fleet.simulate import CONTRACTS_PATH, write_simulation
from fanin.pipelines.pipeline import RunConfig, run_pipeline
from fanin.pipelines.runner_choice import AUTO_CLOSE_PROCESSES, close_processes
from fanin.transforms.forked_helpers import Helpers
from fanin.transforms.join_bounded import CloseGroups

KINDS = ("closes", "late", "dead_letter")
HOT = "hot-join"


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


def _run(path: Path, out: Path, processes: int, **config: Any) -> dict[str, Any]:
    result = run_pipeline(RunConfig(output=str(out), inputs=[str(path)],
                                    contracts_path=CONTRACTS_PATH, close_processes=processes,
                                    **config), ["--runner=FnApiRunner"])
    found = result.metrics().query(MetricsFilter().with_namespace("fanin"))
    files = {kind: {p.name: p.read_bytes() for p in (out / kind).iterdir()} for kind in KINDS}
    return {"files": files,
            "counters": {r.key.metric.name: r.committed for r in found["counters"]}}


def _batches(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """The sizes of the batches sent to helpers, and of those returned undone (the real
    ``submit`` and ``finished`` run)."""
    sent: list[int] = []
    undone: list[int] = []
    submit, finished = Helpers.submit, Helpers.finished

    def counted(self: Helpers[Any, Any], batch: Any, keep: Any = None) -> None:
        sent.append(len(batch))
        submit(self, batch, keep)

    def answered(self: Helpers[Any, Any], wait: bool = False) -> Any:
        done = finished(self, wait)
        undone.extend(len(batch) for _, batch, result in done if result is None)
        return done

    monkeypatch.setattr(Helpers, "submit", counted)
    monkeypatch.setattr(Helpers, "finished", answered)
    return sent, undone


@pytest.mark.parametrize("limits", [{}, {"max_messages_per_join": 3}])
def test_helpers_give_the_files_and_counters_of_one_process(
        traffic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        limits: dict[str, int]) -> None:
    one = _run(traffic, tmp_path / "one", 1, **limits)
    sent, undone = _batches(monkeypatch)
    three = _run(traffic, tmp_path / "three", 3, **limits)
    assert three == one
    assert len(sent) >= 2 and sum(sent) < 401 and not undone  # helpers decided some joins
    assert all(one["files"][kind] for kind in KINDS)
    if limits:  # the per-join limit decided in helpers too
        assert b'"join_too_large"' in b"".join(one["files"]["dead_letter"].values())


def test_batches_are_bounded_in_bytes_and_large_joins_stay_in_the_close_step(
        traffic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = _run(traffic, tmp_path / "one", 1)
    monkeypatch.setattr(CloseGroups, "_BATCH_BYTES", 8_000)
    monkeypatch.setattr(CloseGroups, "_SENT_BYTES", 2_000)
    sent, undone = _batches(monkeypatch)
    assert _run(traffic, tmp_path / "two", 2) == one
    assert len(sent) >= 10 and max(sent) < 128 and not undone
    assert sum(sent) < 350  # the joins over 2,000 bytes were decided by the close step


def test_a_helper_that_dies_or_fails_mid_run_changes_no_output(
        traffic: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = _run(traffic, tmp_path / "one", 1)
    monkeypatch.setattr(CloseGroups, "_BATCH_JOINS", 8)
    decided = CloseGroups._decided
    calls: list[int] = []

    def failing(self: CloseGroups, batch: list[tuple[str, list[bytes]]]) -> Any:
        calls.append(1)  # in the helper's copy of this list: its own count
        if len(calls) == 2:  # the first helper dies on its second batch
            os._exit(9)
        if len(calls) == 3:  # the other raises on its third
            raise MemoryError("injected")
        return decided(self, batch)

    monkeypatch.setattr(CloseGroups, "_decided", failing)
    sent, undone = _batches(monkeypatch)
    assert _run(traffic, tmp_path / "two", 3) == one
    assert len(undone) == 2 and len(sent) > 2  # both helpers failed once, after batches done


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
    (["--close-processes", "2", "--replay"], "--close-processes applies to a bounded run"),
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
