"""The garbage collector's thresholds while ``fanin run`` runs a job in this process
(``fanin.pipelines.collector``): raised for the run, restored after it, however it ends."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fanin.cli import main
from fanin.fleet.simulate import CONTRACTS_PATH
from fanin.pipelines.collector import RUN_THRESHOLDS, collector_for_run

EXAMPLE = str(Path(CONTRACTS_PATH).with_name("triage.jsonl"))


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """Thresholds unlike both Python's defaults and the run's, restored after the test."""
    before = gc.get_threshold()
    gc.set_threshold(900, 11, 12)
    try:
        yield gc.get_threshold()
    finally:
        gc.set_threshold(*before)


def _run(out: Path) -> list[str]:
    return ["run", "--input", EXAMPLE, "--contracts", CONTRACTS_PATH, "--output", str(out)]


def test_a_run_decides_under_the_run_thresholds_and_restores_the_callers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        thresholds: tuple[int, int, int]) -> None:
    from fanin.transforms import join_bounded

    seen: list[tuple[int, int, int]] = []
    decide = join_bounded.bounded_outputs

    def observed(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.get_threshold())
        return decide(*args, **kwargs)

    monkeypatch.setattr(join_bounded, "bounded_outputs", observed)
    assert main(_run(tmp_path / "out")) == 0
    assert seen and set(seen) == {RUN_THRESHOLDS}
    assert gc.get_threshold() == thresholds


def test_a_run_that_fails_restores_the_callers_thresholds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        thresholds: tuple[int, int, int]) -> None:
    from fanin.transforms import join_bounded

    def interrupted(*_: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(join_bounded.CloseGroups, "process", interrupted)
    assert main(_run(tmp_path / "out")) == 130
    assert gc.get_threshold() == thresholds


def test_overlapping_runs_restore_the_thresholds_once_the_last_ends(
        thresholds: tuple[int, int, int]) -> None:
    """Runs on two threads: the first to end leaves the second under the run thresholds."""
    first, second = collector_for_run(), collector_for_run()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert gc.get_threshold() == RUN_THRESHOLDS
    second.__exit__(None, None, None)
    assert gc.get_threshold() == thresholds
