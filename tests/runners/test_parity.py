"""Parity: Prism, DirectRunner (on Prism), Flink [local] and a multi-process Flink cluster give
the same closes, late and dead letters as the local runners, for the bundled example, simulated
fleet traffic (contracts with schemas), the hostile corpus, sorted and unsorted, bounded and
replayed (watermark trigger); every run conserves messages. A missing toolchain fails these
tests (run ``fanin setup all``); none is skipped."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.child_env import file_size_limited

from fanin.cli import main
from fanin.runners.flink_cluster import Cluster, start
from tests.runners.parity import (
    CONTRACTS,
    FLINK_LOCAL,
    REFERENCE,
    Multisets,
    differences,
    on_time_disorder_s,
    run_fanin,
)

pytestmark = pytest.mark.runner

_references: dict[tuple[str, ...], Multisets] = {}


@pytest.fixture
def reference(inputs: dict[str, list[str]], tmp_path_factory: pytest.TempPathFactory):
    """``reference(input_set, mode)``: the local runner's outputs (computed once)."""
    def get(name: str, mode: str, *extra: str) -> Multisets:
        key = (name, mode, *extra)
        if key not in _references:
            out = tmp_path_factory.mktemp(f"ref-{name}-{mode}") / "out"
            _references[key] = run_fanin(inputs[name], out, mode, *REFERENCE[mode], *extra)
        return _references[key]
    return get


@pytest.mark.parametrize(("name", "mode"), [("mixed", "bounded"), ("sorted", "bounded"),
                                            ("mixed", "replay"), ("sorted", "replay")])
def test_prism_equals_local(prism: str, inputs, reference, tmp_path: Path, name: str,
                            mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fanin")
    extra = _on_time(inputs, name, mode)
    got = run_fanin(inputs[name], tmp_path / "out", mode, "--runner=PrismRunner", *extra)
    assert differences(reference(name, mode, *extra), got) == {}
    # a streaming job on Prism is told that Prism may repeat a join's outputs (docs/runners.md)
    warned = any("apache/beam#35771" in r.getMessage() for r in caplog.records)
    assert warned == (mode == "replay")


def test_direct_runner_runs_bounded_jobs_on_prism(prism: str, inputs, reference, tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="apache_beam.runners.direct.direct_runner")
    got = run_fanin(inputs["mixed"], tmp_path / "out", "bounded", "--runner=DirectRunner")
    said = [r.getMessage() for r in caplog.records]
    assert "Running pipeline with PrismRunner." in said
    assert not any("falling back" in m.lower() for m in said), said
    assert differences(reference("mixed", "bounded"), got) == {}


def _on_time(inputs: dict[str, list[str]], name: str, mode: str) -> tuple[str, ...]:
    """Replays on Flink: a watermark no message falls behind (see the late-data test)."""
    if mode != "replay":
        return ()
    return (f"--max-disorder-s={on_time_disorder_s(inputs[name])}",)


@pytest.mark.parametrize(("name", "mode"), [("mixed", "bounded"), ("mixed", "replay"),
                                            ("sorted", "replay")])
def test_flink_local_equals_local(flink_jar: str, inputs, reference, tmp_path: Path, name: str,
                                  mode: str) -> None:
    extra = _on_time(inputs, name, mode)
    got = run_fanin(inputs[name], tmp_path / "out", mode, *FLINK_LOCAL, *extra)
    assert differences(reference(name, mode, *extra), got) == {}


def test_flink_takes_its_job_server_options(flink_jar: str, inputs, reference, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Options only Flink's job server defines pass through ``fanin run`` and the job gives the
    same outputs; one it does not define is bad use: one line, exit 2, no output written."""
    got = run_fanin(inputs["mixed"], tmp_path / "out", "bounded", *FLINK_LOCAL,
                    "--checkpointing_interval=60000", "--max_bundle_size", "50")
    assert differences(reference("mixed", "bounded"), got) == {}
    capsys.readouterr()
    code = main(["run", *[a for f in inputs["mixed"] for a in ("--input", f)], "--contracts",
                 str(CONTRACTS), "--output", str(tmp_path / "typo"), *FLINK_LOCAL,
                 "--max_bundel_size=50"])
    assert code == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fanin:")]
    assert said == ["fanin: error: the FlinkRunner job server defines no option "
                    "--max_bundel_size"]
    assert not [p for p in (tmp_path / "typo").rglob("*") if p.is_file()]
    # a value its job server's parser cannot read: one line (Beam printed its whole usage)
    code = main(["run", *[a for f in inputs["mixed"] for a in ("--input", f)], "--contracts",
                 str(CONTRACTS), "--output", str(tmp_path / "typo"), *FLINK_LOCAL,
                 "--checkpointing_interval=x"])
    assert code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.startswith("fanin:")] == [
        "fanin: error: the FlinkRunner job server's options: argument --checkpointing_interval: "
        "invalid int value: 'x'"]
    assert "usage:" not in err


@pytest.mark.parametrize("runner", ["prism", "flink"])
def test_replay_with_late_data(runner: str, request: pytest.FixtureRequest, inputs, reference,
                               tmp_path: Path) -> None:
    """Messages behind the watermark: the local runner fires a timer that is due before it
    reads the replay's next event (``fanin.transforms.replay``); Prism and the portable Flink
    operator may first process lines that follow it, so such a message can still reach its
    join before the close, or reach a join already decided where the local runner started a
    fresh one. Beam allows both orders (a timer fires *some time* after the watermark passes
    it; docs/runners.md). What must not differ: conservation (checked by ``run_fanin``: every
    message in exactly one output) and the dead letters of the parse. (Which messages are
    late is not comparable with a replay whose watermark covers the input's disorder, even on
    the local runner: a message the join needs, arriving behind the watermark after the
    deadline, leaves the join to close at its deadline with later messages in it, where the
    covered replay closed it earlier and called them late.)"""
    request.getfixturevalue("prism" if runner == "prism" else "flink_jar")
    options = ("--runner=PrismRunner",) if runner == "prism" else FLINK_LOCAL
    expected = reference("mixed", "replay")
    got = run_fanin(inputs["mixed"], tmp_path / "out", "replay", *options)
    assert _parse_errors(got["dead_letter"]) == _parse_errors(expected["dead_letter"])
    assert sum(got["late"].values()) > 0 and sum(expected["late"].values()) > 0  # late data


def _parse_errors(dead_letters: Counter[str]) -> Counter[str]:
    """The dead letters the parse makes (not the join's ``undefined_join``/``join_too_large``)."""
    return Counter({line: n for line, n in dead_letters.items()
                    if json.loads(line)["error"] not in ("undefined_join", "join_too_large")})


def test_flink_cluster_replay_equals_local(flink_cluster: Cluster, inputs, reference,
                                           tmp_path: Path) -> None:
    extra = _on_time(inputs, "mixed", "replay")
    got = run_fanin(inputs["mixed"], tmp_path / "out", "replay", *flink_cluster.run_options(),
                    "--parallelism=2", *extra)
    assert differences(reference("mixed", "replay", *extra), got) == {}


def _rest(cluster: Cluster, path: str) -> Any:
    with urllib.request.urlopen(f"http://{cluster.master}{path}", timeout=5) as reply:
        return json.load(reply)


def _wait(what: str, condition: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _running_job(cluster: Cluster, known: set[str]) -> str | None:
    """A job (not in ``known``) whose tasks are running on the TaskManager."""
    for job in _rest(cluster, "/jobs/overview")["jobs"]:
        if job["jid"] not in known and job["state"] == "RUNNING" and \
                job["tasks"].get("running", 0) > 0:
            return str(job["jid"])
    return None


def test_flink_cluster_survives_a_killed_taskmanager(flink_cluster: Cluster, inputs,
                                                     tmp_path: Path) -> None:
    """SIGKILL the TaskManager while a bounded job runs; a replacement TaskManager is started
    (as a supervisor would); the job restarts and its files equal, byte for byte, those of the
    uninterrupted local run, with no temporary file left."""
    local = tmp_path / "local"
    run_fanin(inputs["mixed"], local, "bounded", *REFERENCE["bounded"])
    known = {j["jid"] for j in _rest(flink_cluster, "/jobs/overview")["jobs"]}
    out = tmp_path / "cluster"
    args = [sys.executable, "-m", "fanin.cli", "run",
            *[a for f in inputs["mixed"] for a in ("--input", f)],
            "--contracts", str(CONTRACTS), "--output", str(out), "--overwrite",
            *flink_cluster.run_options(), "--parallelism=2"]
    with open(tmp_path / "submit.log", "wb") as log:
        job = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            jid = _wait("the job's tasks to run", lambda: _running_job(flink_cluster, known), 240)
            victim = flink_cluster.pid("taskexecutor")
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            _wait("the TaskManager to die", lambda: flink_cluster.pid("taskexecutor") is None, 10)
            start(flink_cluster, say=lambda _line: None)  # the replacement
            assert job.wait(timeout=400) == 0, (tmp_path / "submit.log").read_text()[-2000:]
        finally:
            if job.poll() is None:
                job.kill()
    history = _rest(flink_cluster, f"/jobs/{jid}/exceptions")
    assert history.get("exceptionHistory", {}).get("entries"), "the job never failed over"
    assert _rest(flink_cluster, f"/jobs/{jid}")["state"] == "FINISHED"
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(local) for p in local.rglob("*") if p.is_file())
    for name in files:
        assert (out / name).read_bytes() == (local / name).read_bytes(), name


def test_an_input_cut_short_is_its_one_line_on_every_runner(
        prism: str, flink_jar: str, tmp_path: Path) -> None:
    """docs/spec.md §1: a compressed input cut short stops the run with one line naming the
    last line read, exit 2, on Prism and Flink as on the local runner: the `fanin` process's
    standard error holds no traceback and ends with that line (Prism's failure was
    "Traceback (most recent call last):", exit 1; then the one line, below ~340 lines of the
    worker's traceback as Beam's worker printed it, Prism relayed it and the job client logged
    it; on Flink ~170 lines)."""
    import gzip
    import re

    from tests.runners.conftest import EXAMPLE

    packed = gzip.compress(EXAMPLE.read_bytes())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(packed[:len(packed) // 2])
    expected = re.compile(rf"fanin: error: input {re.escape(str(path))} cannot be decompressed "
                          r"after line [1-9]\d* \(the file is cut short\) \(EOFError: [^)]+\)"
                          r"( \[while running '[^']+'\])?")
    fanin = str(Path(sys.executable).with_name("fanin"))
    for runner in ([], ["--runner=PrismRunner"], list(FLINK_LOCAL)):
        done = subprocess.run(
            [fanin, "run", "--input", str(path), "--output", str(tmp_path / f"o{len(runner)}"),
             "--contracts", str(CONTRACTS), *runner], capture_output=True, text=True,
            timeout=300, check=False)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and expected.fullmatch(lines[-1]), (runner, lines[-3:])
        assert "Traceback" not in done.stderr and len(lines) <= 5, (runner, done.stderr[-3000:])


def test_a_write_the_disk_refuses_is_one_line_on_every_runner(
        prism: str, flink_jar: str, tmp_path: Path) -> None:
    """docs/spec.md §5: a failed write stops the run with one line, exit 1, on every runner.
    Files limited to 200 KiB (``ulimit -f``): the job's spill of its closes fails (on Flink
    the job server's own files first, which Flink reports in one line). On Prism it was "the
    runner failed the job (FAILED): bundle ... failed:Traceback (most recent call last):"
    below ~160 lines of the worker's traceback as the job client and Prism logged it."""
    import re

    path = tmp_path / "in.jsonl"
    subprocess.run([sys.executable, "-m", "fanin.cli", "simulate", "--joins", "2000", "--seed",
                    "7", "--out", str(path)], check=True, capture_output=True)
    fanin = str(Path(sys.executable).with_name("fanin"))
    for runner in ([], ["--runner=PrismRunner"], list(FLINK_LOCAL)):
        done = subprocess.run(file_size_limited(
            [fanin, "run", "--input", str(path), "--output", str(tmp_path / f"o{len(runner)}"),
             "--contracts", str(CONTRACTS), *runner], 200 << 10), capture_output=True,
            text=True, timeout=300, check=False)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1, (runner, done.stderr[-3000:])
        line = (r"fanin: error: the runner failed the job \(FAILED\): java.io.IOException: "
                r"File too large" if runner == list(FLINK_LOCAL) else
                r"fanin: error: the job failed reading or writing files: cannot write '[^']+': "
                r"File too large \[while running '[^']+'\]")
        if runner == list(FLINK_LOCAL):  # Beam then stops the job server, and says so
            assert "Really destroying service" in lines.pop(), (runner, lines)
        assert re.fullmatch(line, lines[-1]), (runner, lines)
        assert "Traceback" not in done.stderr and len(lines) <= 5, (runner, done.stderr[-3000:])
