"""Bad use of ``fanin simulate`` is one line on stderr and exit code 2, and writes nothing."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from support.child_env import same_code_env

from fanin.fleet.cli import MAX_JOINS, MIN_JOINS_PER_S, add_subcommand

FANIN = [sys.executable, "-c", "import sys; from fanin.cli import main; sys.exit(main())"]


def bad_use(cwd: Path, *argv: str) -> str:
    """Run ``fanin simulate ARGV`` in ``cwd``; check exit 2 with one stderr line; return it."""
    child = subprocess.run([*FANIN, "simulate", *argv], cwd=cwd, capture_output=True,
                           text=True, timeout=60, env=same_code_env())
    assert child.returncode == 2, child.stderr
    assert "Traceback" not in child.stderr
    lines = child.stderr.splitlines()
    assert len(lines) == 1, child.stderr
    assert child.stdout == ""
    return lines[0]


def test_a_rate_slower_than_one_join_a_day_is_bad_use(tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    line = bad_use(tmp_path, "--joins", "3", "--rate", "1e-10/s", "--out", str(out))
    assert "--rate" in line and "1e-10/s" in line
    assert not out.exists()


@pytest.mark.parametrize("joins", ["99999999999999999999", str(MAX_JOINS + 1)])
def test_too_many_joins_is_bad_use(tmp_path: Path, joins: str) -> None:
    out = tmp_path / "x.jsonl"
    line = bad_use(tmp_path, "--joins", joins, "--out", str(out))
    assert "--joins" in line and str(MAX_JOINS) in line
    assert not out.exists()


@pytest.mark.parametrize("where", ["under_a_file", "a_folder", "missing_folder", "empty"])
def test_an_out_file_that_cannot_be_written_is_bad_use(tmp_path: Path, where: str) -> None:
    (tmp_path / "afile").write_text("keep\n")
    (tmp_path / "folder").mkdir()
    out = {"under_a_file": str(tmp_path / "afile" / "x.jsonl"),
           "a_folder": str(tmp_path / "folder"),
           "missing_folder": str(tmp_path / "nowhere" / "x.jsonl"),
           "empty": ""}[where]
    line = bad_use(tmp_path, "--joins", "3", "--out", out)
    assert "--out" in line and (out in line if out else True)
    assert (tmp_path / "afile").read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["afile", "folder"]


def test_rate_with_a_fixed_start_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    line = bad_use(tmp_path, "--joins", "3", "--rate", "2/s", "--start",
                   "2026-01-01T00:00:00Z", "--out", str(out))
    assert "--rate" in line and "--start" in line
    assert not out.exists()


def test_the_bounds_themselves_are_accepted() -> None:
    parser = argparse.ArgumentParser(prog="fanin")
    add_subcommand(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["simulate", "--joins", str(MAX_JOINS), "--out", "x.jsonl",
                              "--rate", f"{MIN_JOINS_PER_S!r}/s"])
    assert args.joins == MAX_JOINS and args.rate == MIN_JOINS_PER_S
    assert parser.parse_args(["simulate", "--joins", "0", "--out", "-", "--rate", "1/s"]).rate == 1
