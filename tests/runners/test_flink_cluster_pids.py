"""``fanin flink-cluster stop`` signals only the processes of its cluster: a pid file that
names another process (a stale file whose pid was reused), or -1 or 0 (kill(-1) signals every
process the user may signal), is removed and nothing is signalled. Real processes, no Flink."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
