"""``fanin flink-cluster stop`` signals only the processes of its cluster: a pid file that
names another process (a stale file whose pid was reused), or -1 or 0 (kill(-1) signals every
process the user may signal), is removed and nothing is signalled. Real processes, no Flink."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fanin.cli import main as fanin_main
from fanin.runners.flink_cluster import Cluster, stop


@pytest.mark.parametrize("role", ["pool", "taskexecutor", "standalonesession"])
@pytest.mark.parametrize("named", ["other", "-1", "0"])
def test_stop_leaves_a_process_that_is_not_the_clusters(tmp_path: Path, role: str,
                                                         named: str) -> None:
    cluster = Cluster(str(tmp_path))
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, start_new_session=True)
    try:
        Path(cluster.pid_file(role)).write_text(str(other.pid) if named == "other" else named)
        said: list[str] = []
        stop(cluster, say=said.append)
        assert other.poll() is None  # still running: not signalled
        assert not Path(cluster.pid_file(role)).exists()
        assert said == [f"flink-cluster: {role}: its pid file names no process of this "
                        "cluster; removed it, signalled nothing"]
    finally:
        other.communicate(b"")


def test_a_pool_of_another_port_is_not_this_clusters(tmp_path: Path) -> None:
    """Arguments are compared whole: ``--service_port=50000`` is not port 5000's."""
    cluster = Cluster(str(tmp_path), pool_port=5000)
    other = subprocess.Popen([sys.executable, "-c",
                              "import sys; print('up', flush=True); sys.stdin.read()",
                              "apache_beam.runners.worker.worker_pool_main",
                              "--service_port=50000"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             start_new_session=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == b"up\n"  # exec'd
        Path(cluster.pid_file("pool")).write_text(str(other.pid))
        assert cluster.pid("pool") is None
        assert Cluster(str(tmp_path), pool_port=50000).pid("pool") == other.pid
        stop(cluster, say=lambda _line: None)
        assert other.poll() is None
    finally:
        other.communicate(b"")


def test_a_pool_port_in_use_is_one_line_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its pool failed to bind (its log said so) and start said ready all the same."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert fanin_main(["flink-cluster", "start", "--dir", str(tmp_path / "fc"),
                           "--rest-port", str(port + 10 if port < 65000 else port - 10),
                           "--pool-port", str(port)]) == 1
    assert capsys.readouterr().err == (
        f"fanin: error: port {port} (--pool-port) is in use: the Beam worker pool could not "
        "listen there\n")
    assert not (tmp_path / "fc").exists()
