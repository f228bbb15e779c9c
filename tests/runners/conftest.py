"""Fixtures of the runner parity suite: the set-up it needs (checked, never skipped), the inputs,
and one local Flink cluster for the module that asks for it."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanin.runners import toolchain
from fanin.runners.flink_cluster import Cluster, start, stop
from fanin.transforms.replay import scan_line

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fanin" / "examples" / "triage.jsonl"
CONTRACTS = ROOT / "fanin" / "examples" / "contracts.yaml"
FUZZ = sorted((ROOT / "tests" / "data" / "fuzz_corpus").glob("*.bin"))


def _require(path: str, what: str) -> str:
    if not os.path.isfile(path):
        pytest.fail(f"{what} is not set up ({path} missing): run `fanin setup all` "
                    "(.ci/run does)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def prism() -> str:
    """The Prism binary Beam uses for PrismRunner/DirectRunner (fails loudly if absent)."""
    binary = _require(toolchain.prism_binary(), "Prism")
    _require(binary + ".zip", "Prism's release zip")
    return binary


@pytest.fixture(scope="session")
def flink_jar() -> str:
    """The Flink job server jar (fails loudly if absent)."""
    return _require(toolchain.flink_job_server_jar(), "The Flink job server")


@pytest.fixture(scope="session")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Named input sets (lists of files): ``mixed`` = the bundled example, simulated fleet
    traffic in arrival order (unsorted) and the hostile corpus; ``sorted`` = the simulated
    traffic sorted by event time."""
    folder = tmp_path_factory.mktemp("inputs")
    simulated = folder / "simulated.jsonl"
    subprocess.run([sys.executable, "-m", "fanin.cli", "simulate", "--joins", "40", "--seed",
                    "11", "--showcase", "--out", str(simulated)], check=True)
    lines = [line for line in simulated.read_bytes().split(b"\n") if line.strip()]
    assert any(scan_line(a)[0] and scan_line(b)[0] and scan_line(a)[0] > scan_line(b)[0]
               for a, b in itertools.pairwise(lines)), "traffic must be unsorted"
    ordered = sorted(lines, key=lambda line: (scan_line(line)[0] is None,
                                              scan_line(line)[0] or 0))  # stable
    sorted_file = folder / "sorted.jsonl"
    sorted_file.write_bytes(b"\n".join(ordered) + b"\n")
    return {"mixed": [str(EXAMPLE), str(simulated), *map(str, FUZZ)],
            "sorted": [str(sorted_file)]}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def flink_cluster(tmp_path_factory: pytest.TempPathFactory, flink_jar: str) -> Iterator[Cluster]:
    """A JobManager, a TaskManager and a Beam worker pool, as separate processes."""
    home = toolchain.flink_home()
    _require(os.path.join(home, "bin", "jobmanager.sh"), "The Flink distribution")
    port = _free_port()
    while any(_in_use(p) for p in (port + 1, port + 2)):
        port = _free_port()
    cluster = Cluster(str(tmp_path_factory.mktemp("flink-cluster")), port, _free_port(), 2)
    start(cluster, say=lambda _line: None)
    try:
        yield cluster
    finally:
        stop(cluster, say=lambda _line: None)


def _in_use(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
