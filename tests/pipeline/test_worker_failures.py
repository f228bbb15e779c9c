"""The local runner with its SDK workers in threads or processes of their own
(``--direct_num_workers 2 --direct_running_mode multi_threading|multi_processing``, as the
README suggests): a failure ``fanin run`` reports is still one line and its exit code, with no
traceback from the ``fanin`` process or its workers (docs/spec.md §1 "an input cut short",
§5 "a failed write")."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.child_env import file_size_limited

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fanin" / "examples" / "triage.jsonl"
CONTRACTS = ROOT / "fanin" / "examples" / "contracts.yaml"
FANIN = str(Path(sys.executable).with_name("fanin"))
MODES = ["multi_threading", "multi_processing"]


def _run(out: Path, path: Path, mode: str, file_limit: int | None = None
         ) -> subprocess.CompletedProcess[str]:
    command = [FANIN, "run", "--input", str(path), "--contracts", str(CONTRACTS), "--output",
               str(out), "--direct_num_workers", "2", "--direct_running_mode", mode]
    if file_limit is not None:
        command = file_size_limited(command, file_limit)
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("mode", MODES)
def test_an_input_cut_short_is_one_line_and_exit_2(tmp_path: Path, mode: str) -> None:
    """Before: exit 1 and a traceback of the ``fanin`` process (the runner relays its worker's
    failure as a RuntimeError holding the worker's traceback), with the workers' printed
    tracebacks: 139 lines (threads), 223 (processes)."""
    packed = gzip.compress(EXAMPLE.read_bytes() * 20)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(packed[:len(packed) // 2])
    done = _run(tmp_path / "out", path, mode)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-3000:]
    assert re.fullmatch(rf"fanin: error: input {re.escape(str(path))} cannot be decompressed "
                        r"after line [1-9]\d* \(the file is cut short\) \(EOFError: [^)]+\) "
                        r"\[while running 'Read/Lines'\]", lines[-1]), lines[-1]
    assert "Traceback" not in done.stderr and "Error" not in "".join(lines[:-1]), done.stderr


@pytest.mark.parametrize("mode", MODES)
def test_a_write_the_disk_refuses_is_one_line_and_exit_1(tmp_path: Path, mode: str) -> None:
    """Files limited to 4 KiB (``ulimit -f``): the first spill of the closes fails. Before:
    exit 1 with a traceback of the ``fanin`` process and no ``fanin: error`` line."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(EXAMPLE.read_bytes() * 20)
    done = _run(tmp_path / "out", path, mode, file_limit=4096)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr[-3000:]
    assert re.fullmatch(r"fanin: error: the job failed reading or writing files: cannot write "
                        r"'[^']+': File too large \[while running '[^']+'\]", lines[-1]), lines
    assert "Traceback" not in done.stderr and "Error" not in "".join(lines[:-1]), done.stderr
