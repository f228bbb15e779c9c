"""A run leaves nothing in the system's temporary folder: Beam makes a folder there
(``beam-pipeline-temp*``) when a pipeline is made and removes it only when the pipeline runs,
so a dry run, or a run refused after its job was built, left one behind each time."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from fanin.cli import main
from fanin.fleet.simulate import CONTRACTS_PATH

EXAMPLE = str(Path(CONTRACTS_PATH).with_name("triage.jsonl"))


@pytest.fixture
def system_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "system-tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.mark.parametrize("case, code", [
    ("run", 0),
    ("dry run", 0),
    ("missing input", 2),
    ("replay of a missing input", 2),
])
def test_nothing_is_left_in_the_system_temporary_folder(
        tmp_path: Path, system_tmp: Path, case: str, code: int) -> None:
    given = {"run": ["--input", EXAMPLE],
             "dry run": ["--input", EXAMPLE, "--dry-run", str(tmp_path / "graph.json")],
             "missing input": ["--input", str(tmp_path / "none" / "*.jsonl")],
             "replay of a missing input": ["--input", str(tmp_path / "gone.jsonl"),
                                           "--replay"]}[case]
    assert main(["run", *given, "--contracts", CONTRACTS_PATH,
                 "--output", str(tmp_path / "out")]) == code
    assert sorted(p.name for p in system_tmp.iterdir()) == []
