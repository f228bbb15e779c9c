"""A worker failure inside the real join, on the multi-process local runner.

The failure is injected without editing the pipeline: ``build`` (the production wiring) is
given a ``Catalog`` subclass that raises when a worker process unpickles it, i.e. when a
worker sets up the join step for a bundle. (A failure *inside* the core, e.g. in
``Catalog.definition`` while deciding, is contained to its join and is tested
in ``tests/reliability/test_poison.py``; this test is about failures of the worker itself.)
"Once" is coordinated across worker processes by an exclusively created flag file, so exactly
one bundle fails once; "always" fails every bundle of the join step.
The local runner does not retry a failed bundle, so the run fails loudly (an exception from
``run``/``wait_until_finish``) and never completes with missing closes; it leaves no output
file, only hidden ``.tmp-`` spills, and a rerun with ``--overwrite`` equals a clean run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.internal import cloudpickle
from apache_beam.options.pipeline_options import PipelineOptions

from fanin.contracts.catalog import Catalog, Contract, JoinDefaults, load_contracts
from fanin.fleet.simulate import CONTRACTS_PATH, write_simulation
from fanin.pipelines.pipeline import RunConfig, build, run_pipeline

KINDS = ("closes", "late", "dead_letter")
MULTI = ["--runner=FnApiRunner", "--direct_num_workers=2",
         "--direct_running_mode=multi_processing"]

# Workers unpickle the catalog: ship this module's classes by value (tests/ is not on their
# import path).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class InjectedFault(RuntimeError):
    """The failure this test injects."""


class FlakyCatalog(Catalog):
    """A catalog that fails to load in a worker process (any process but the one that built
    the pipeline): once overall (``flag`` file) or always."""

    def __init__(self, contracts: Mapping[str, Contract], defaults: JoinDefaults, flag: str,
                 always: bool, driver: int) -> None:
        super().__init__(contracts, defaults)
        self._flag, self._always, self._driver = flag, always, driver
        if os.getpid() == driver:
            return
        if self._always:
            raise InjectedFault("injected: every bundle fails")
        try:
            os.close(os.open(self._flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        raise InjectedFault("injected: this bundle fails once")

    def __reduce__(self) -> tuple[Any, ...]:
        return (FlakyCatalog, (self.contracts, self.defaults, self._flag, self._always,
                               self._driver))


def read(out: Path) -> dict[str, list[str]]:
    return {kind: sorted(x for f in (out / kind).glob("*.jsonl")
                         for x in f.read_text().splitlines()) for kind in KINDS}


@pytest.fixture(scope="module")
def traffic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
    folder = tmp_path_factory.mktemp("faults")
    path = folder / "traffic.jsonl"
    write_simulation(path, joins=80, seed=21)
    clean = folder / "clean"
    run_pipeline(RunConfig(output=str(clean), inputs=[str(path)],
                           contracts_path=CONTRACTS_PATH), [])
    return path, read(clean)


def run_flaky(path: Path, out: Path, always: bool) -> None:
    config = RunConfig(output=str(out), inputs=[str(path)], contracts_path=CONTRACTS_PATH)
    for kind in KINDS:
        (out / kind).mkdir(parents=True)
    catalog = FlakyCatalog(load_contracts(CONTRACTS_PATH), JoinDefaults(),
                           str(out / "fault.flag"), always, os.getpid())
    p = beam.Pipeline(options=PipelineOptions(MULTI))
    build(p, config, catalog)
    p.run().wait_until_finish()


@pytest.mark.parametrize("always", [False, True], ids=["once", "always"])
def test_a_bundle_failure_fails_the_run_loudly_and_leaves_no_output_file(
        traffic: tuple[Path, dict[str, list[str]]], tmp_path: Path, always: bool) -> None:
    """The local runner does not retry a failed bundle: one failure fails the whole run with
    the worker's exception, and the run leaves no output file — only hidden ``.tmp-`` spills,
    which no reader counts and ``--overwrite`` removes (a rerun then equals a clean run)."""
    path, clean = traffic
    out = tmp_path / "out"
    with pytest.raises(Exception) as info:
        run_flaky(path, out, always)
    assert "InjectedFault" in repr(info.value) or "injected" in str(info.value), info.value
    assert always or (out / "fault.flag").exists(), "the fault was never injected"
    for kind in KINDS:
        for f in (out / kind).iterdir():
            assert f.name.startswith(".") and ".tmp-" in f.name, f
    run_pipeline(RunConfig(output=str(out), inputs=[str(path)], contracts_path=CONTRACTS_PATH,
                           overwrite=True), [])
    assert read(out) == clean
    assert not [f for kind in KINDS for f in (out / kind).iterdir() if f.name.startswith(".")]
