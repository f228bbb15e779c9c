"""Inputs a run cannot read to an end are bad use, refused before anything is written: one
line, exit 2 (a named pipe as --input or --contracts blocked the run for good, also matched
by a glob; an empty --input read every file of the folder it ran in; an empty --contracts ran
with none); an output subfolder that links to nothing is refused before --overwrite deletes
anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fanin.cli import main
from fanin.fleet.simulate import CONTRACTS_PATH

EXAMPLE = str(Path(CONTRACTS_PATH).with_name("triage.jsonl"))


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("case, expected", [
    ("input", "input is not a regular file (a pipe, a device or a socket): {fifo}"),
    ("glob", "input is not a regular file (a pipe, a device or a socket): {fifo}"),
    ("contracts", "{fifo}: cannot read contracts file: not a regular file"),
    ("empty input", "--contracts and --input name a file: an empty one names none"),
    ("empty contracts", "--contracts and --input name a file: an empty one names none"),
])
def test_an_input_that_cannot_be_read_to_its_end_is_one_line(
        tmp_path: Path, fifo: str, case: str, expected: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    given = {"input": ["--input", fifo, "--contracts", CONTRACTS_PATH],
             "glob": ["--input", str(tmp_path / "*.jsonl"), "--contracts", CONTRACTS_PATH],
             "contracts": ["--input", EXAMPLE, "--contracts", fifo],
             "empty input": ["--input", "", "--contracts", CONTRACTS_PATH],
             "empty contracts": ["--input", EXAMPLE, "--contracts", ""]}[case]
    out = tmp_path / "out"
    for replay in ([], ["--replay"]):
        assert main(["run", *given, *replay, "--output", str(out)]) == 2
        assert capsys.readouterr().err.strip().splitlines() == \
            [f"fanin: error: {expected.format(fifo=fifo)}"]
        assert not out.exists()


def test_an_output_subfolder_linked_to_nothing_is_refused_before_anything_is_deleted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    args = ["run", "--input", EXAMPLE, "--contracts", CONTRACTS_PATH, "--output", str(out)]
    assert main(args) == 0
    kept = sorted(p.name for p in (out / "closes").iterdir())
    for child in (out / "late").iterdir():
        child.unlink()
    (out / "late").rmdir()
    os.symlink(tmp_path / "gone", out / "late")
    capsys.readouterr()
    assert main([*args, "--overwrite"]) == 2
    assert capsys.readouterr().err.strip() == (f"fanin: error: --output: {out / 'late'} is a "
                                               f"symbolic link to nothing ({tmp_path / 'gone'})")
    assert sorted(p.name for p in (out / "closes").iterdir()) == kept


@pytest.mark.parametrize("target", ["gone", "loop"])
def test_an_output_folder_linked_to_nothing_is_named_so(
        tmp_path: Path, target: str, capsys: pytest.CaptureFixture[str]) -> None:
    """It read "cannot create or lock OUT: File exists" (the subfolders were named so)."""
    out = tmp_path / "out"
    os.symlink(tmp_path / target, out)
    if target == "loop":
        os.symlink(out, tmp_path / "loop")
    assert main(["run", "--input", EXAMPLE, "--contracts", CONTRACTS_PATH, "--output",
                 str(out)]) == 2
    assert capsys.readouterr().err.strip() == (f"fanin: error: --output: {out} is a "
                                               f"symbolic link to nothing ({tmp_path / target})")


@pytest.mark.parametrize("which", ["input", "contracts file"])
def test_a_dry_run_report_onto_the_runs_input_is_refused(
        tmp_path: Path, which: str, capsys: pytest.CaptureFixture[str]) -> None:
    data, contracts = tmp_path / "in.jsonl", tmp_path / "contracts.yaml"
    data.write_bytes(Path(EXAMPLE).read_bytes())
    contracts.write_bytes(Path(CONTRACTS_PATH).read_bytes())
    target = data if which == "input" else contracts
    before = target.read_bytes()
    assert main(["run", "--input", str(data), "--contracts", str(contracts), "--output",
                 str(tmp_path / "out"), "--dry-run", str(target)]) == 2
    assert capsys.readouterr().err.strip() == \
        f"fanin: error: --dry-run {target}: is the run's {which}; give another file"
    assert target.read_bytes() == before
