"""Bad use of ``fanin simulate`` is one line on stderr and exit code 2, and writes nothing; a
simulation that fails or is stopped while it writes leaves no file that would pass for a
whole one."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

import pytest
from support.child_env import same_code_env

import fanin.fleet.cli as simulate_cli
from fanin.cli import main
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


def test_a_seed_of_too_many_digits_is_bad_use(tmp_path: Path) -> None:
    """It is in every join id (256 characters at most): a traceback, an empty file left."""
    out = tmp_path / "x.jsonl"
    line = bad_use(tmp_path, "--joins", "2", "--seed", "9" * 101, "--out", str(out))
    assert "--seed" in line and "at most 100 digits" in line
    assert not out.exists()
    assert main(["simulate", "--joins", "2", "--seed", "-" + "9" * 100, "--out", str(out)]) == 0


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


def test_a_start_too_late_for_the_simulation_is_bad_use(tmp_path: Path) -> None:
    """Every time after year 9999 was written as 9999-12-31T23:59:59.999Z, without a word:
    a file whose joins all opened and reported at one instant."""
    out = tmp_path / "x.jsonl"
    line = bad_use(tmp_path, "--joins", "3", "--start", "9999-12-31T23:59:59.999Z",
                   "--out", str(out))
    assert line.startswith("fanin simulate: error: --start 9999-12-31T23:59:59.999Z: ")
    assert "past 9999-12-31T23:59:59.999Z" in line
    assert not out.exists()
    # refused before the first line: nothing on standard output either (bad_use checks it)
    bad_use(tmp_path, "--joins", "50", "--start", "9999-12-31T23:59:00Z", "--out", "-")
    assert main(["simulate", "--joins", "3", "--start", "9999-12-31T00:00:00Z",
                 "--out", str(out)]) == 0
    assert out.read_text().count("9999-12-31T") > 3


def test_the_bounds_themselves_are_accepted() -> None:
    parser = argparse.ArgumentParser(prog="fanin")
    add_subcommand(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["simulate", "--joins", str(MAX_JOINS), "--out", "x.jsonl",
                              "--rate", f"{MIN_JOINS_PER_S!r}/s"])
    assert args.joins == MAX_JOINS and args.rate == MIN_JOINS_PER_S
    assert parser.parse_args(["simulate", "--joins", "0", "--out", "-", "--rate", "1/s"]).rate == 1


def _stops_after_some_lines(failure: BaseException) -> Any:
    """A ``write_lines``/``write_paced`` stand-in: two whole lines and half of one, then
    ``failure`` (Ctrl-C, a full disk: a real one cannot be aimed at the middle of a write)."""
    def write(out: TextIO, *_: Any, **__: Any) -> None:
        out.write('{"kind": "open"}\n{"kind": "open"}\n{"kind": "op')
        out.flush()
        raise failure
    return write


@pytest.mark.parametrize(("failure", "code", "line"), [
    (KeyboardInterrupt(), 130, "fanin simulate: interrupted"),
    (OSError(28, "No space left on device"), 1, "fanin simulate: cannot write {out}: No space "
                                                 "left on device")])
def test_a_simulation_stopped_while_it_writes_leaves_no_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        failure: BaseException, code: int, line: str) -> None:
    """Its lines were left under FILE: cut short, or whole (after Ctrl-C), passing for a
    complete simulation."""
    monkeypatch.setattr(simulate_cli, "write_lines", _stops_after_some_lines(failure))
    out = tmp_path / "x.jsonl"
    assert main(["simulate", "--joins", "3", "--out", str(out)]) == code
    assert capsys.readouterr().err.splitlines() == [line.format(out=out)]
    assert list(tmp_path.iterdir()) == []


def test_a_paced_simulation_stopped_keeps_the_lines_written_as_they_came_due(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--rate`` writes a live stream: Ctrl-C is how it ends, and its lines are its output."""
    monkeypatch.setattr(simulate_cli, "write_paced", _stops_after_some_lines(KeyboardInterrupt()))
    out = tmp_path / "x.jsonl"
    assert main(["simulate", "--joins", "3", "--rate", "1/s", "--start", "now", "--out",
                 str(out)]) == 130
    assert out.read_text().startswith('{"kind": "open"}\n')


def test_a_pipe_is_never_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a regular file is removed after a failure: FILE may name a pipe a reader holds."""
    monkeypatch.setattr(simulate_cli, "write_lines", _stops_after_some_lines(OSError(32, "x")))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert main(["simulate", "--joins", "3", "--out", str(fifo)]) == 1
    finally:
        os.close(reader)
    assert fifo.is_fifo()


def test_a_link_to_the_file_is_never_removed(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """FILE reached through a link (``/dev/stdout`` redirected to a file is one): removing the
    name would remove the link, not what was written."""
    monkeypatch.setattr(simulate_cli, "write_lines", _stops_after_some_lines(KeyboardInterrupt()))
    target, link = tmp_path / "x.jsonl", tmp_path / "link"
    os.symlink(target, link)
    assert main(["simulate", "--joins", "3", "--out", str(link)]) == 130
    assert link.is_symlink() and target.is_file()
