"""Reruns and restarts of bounded runs: determinism, crash safety of outputs, ``--overwrite``.

- The same input twice gives byte-identical output files (names and bytes).
- A ``fanin run`` killed with SIGKILL while it writes leaves no file that looks complete but is
  partial: every ``*.jsonl`` present parses fully and ends with a newline; partial files only
  ever carry a ``.tmp-`` name. Rerunning from scratch with ``--overwrite`` gives exactly the
  files of an uninterrupted run, and without ``--overwrite`` the leftovers are refused; until
  then ``fanin report`` warns that the folder's run stopped before its end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fanin.cli import main
from fanin.fleet.simulate import CONTRACTS_PATH, write_simulation
from fanin.pipelines.pipeline import RunConfig, run_pipeline

KINDS = ("closes", "late", "dead_letter")
FANIN = Path(sys.executable).with_name("fanin")
SHARDS = 16


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file under the three output folders, by relative path."""
    return {str(p.relative_to(out)): p.read_bytes()
            for kind in KINDS for p in sorted((out / kind).iterdir())}


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "traffic.jsonl"
    write_simulation(path, joins=1200, seed=9)
    return path


@pytest.fixture(scope="module")
def reference(big: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("reference") / "out"
    run_pipeline(RunConfig(output=str(out), inputs=[str(big)], contracts_path=CONTRACTS_PATH,
                           shards=SHARDS), [])
    return snapshot(out)


def test_same_input_twice_is_byte_identical(big: Path, tmp_path: Path,
                                            reference: dict[str, bytes]) -> None:
    out = tmp_path / "again"
    run_pipeline(RunConfig(output=str(out), inputs=[str(big)], contracts_path=CONTRACTS_PATH,
                           shards=SHARDS), [])
    again = snapshot(out)
    assert again == reference
    assert sum(name.startswith("closes/") for name in again) == SHARDS


def _outputs_present(out: Path) -> bool:
    return any((out / kind).is_dir() and any((out / kind).iterdir()) for kind in KINDS)


def test_killed_run_leaves_no_false_complete_file_and_rerun_matches(
        big: Path, tmp_path: Path, reference: dict[str, bytes],
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "killed"
    argv = ["run", "--input", str(big), "--contracts", CONTRACTS_PATH, "--output", str(out),
            "--shards", str(SHARDS)]
    proc = subprocess.Popen([str(FANIN), *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONHASHSEED": "0"})
    try:
        limit = time.monotonic() + 60
        while not _outputs_present(out):  # the first output file (or .tmp-) appeared
            assert time.monotonic() < limit, "the run wrote nothing within 60 s"
            try:
                proc.wait(timeout=0.002)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"fanin run exited ({proc.returncode}) before writing outputs")
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = {name: data for name, data in snapshot(out).items()}
    complete = {n: d for n, d in left.items() if n.endswith(".jsonl")}
    partial = [n for n in left if not n.endswith(".jsonl")]
    assert all(".tmp-" in n for n in partial), partial
    assert len(complete) < len(reference), "the kill landed after the run had finished"
    for name, data in complete.items():
        assert data.endswith(b"\n"), name
        for line in data.decode("utf-8").splitlines():
            json.loads(line)
        assert data == reference[name], f"{name} differs from the uninterrupted run's"
    capsys.readouterr()
    assert main(["report", str(out)]) == 0  # a reader is told the outputs are partial
    assert "stopped before its end" in capsys.readouterr().err
    assert main(argv) == 2  # leftovers are not mixed in silently
    capsys.readouterr()
    assert main([*argv, "--overwrite"]) == 0
    assert snapshot(out) == reference
    assert main(["report", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err  # a finished run leaves no mark
