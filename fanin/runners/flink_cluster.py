"""``fanin flink-cluster start|stop|status``: a real multi-process Flink cluster on this machine.

Guarantees:
- ``start`` runs a JobManager and a TaskManager as separate JVM processes (the scripts of the
  distribution ``fanin setup flink`` installs) and a Beam worker pool
  (``python -m apache_beam.runners.worker.worker_pool_main``) for ``--environment_type
  EXTERNAL``; everything listens on 127.0.0.1 only. Configuration, logs and pid files live in
  ``--dir``. It returns once the REST API reports a registered TaskManager (or fails with the
  log's path after ``--timeout-s``) and prints the ``fanin run`` options that submit to it.
- ``start`` is idempotent and also repairs: a process of the cluster that is not running (e.g. a
  TaskManager that was killed) is started again; the ports must then be the same as before.
- The cluster restarts failed jobs (fixed delay, 5 attempts, 2 s apart) and notices a lost
  TaskManager within 10 s (heartbeat), so a job survives a TaskManager that dies and is
  replaced.
- ``stop`` ends the processes it started (by their pid files) and says what it ended.
- Numeric options are checked when the command line is parsed, before anything starts or is
  written: ``--rest-port`` in [1, 65533] (the JobManager RPC and blob ports are the next two),
  ``--pool-port`` in [1, 65535], ``--slots`` in [1, 2**31 - 1] (Flink reads it as a Java
  ``int``), ``--timeout-s`` finite and > 0; then, before anything starts or is written,
  ``--pool-port`` is none of the cluster's own ports and ``--dir`` is a folder (or absent).
  Bad use is one ``fanin: error:`` line on stderr and exit code 2, for every action.
- ``start`` starts the worker pool only on a free port (else one line, exit 1, before any
  process starts), and says ``ready`` only once the pool it started listens: a pool that
  exits (it failed to bind, say) is one line naming its log, exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from fanin.io.cli import positive_seconds
from fanin.io.files import nearest_existing

__all__ = ["Cluster", "add_subcommand", "start", "stop"]

_MAX_PORT = 65535
_MAX_SLOTS = 2**31 - 1  # Flink's taskmanager.numberOfTaskSlots is a Java int

_CONFIG = """\
env:
  java:
    opts:
      all: {java_opts}
jobmanager:
  bind-host: 127.0.0.1
  rpc: {{address: 127.0.0.1, port: {rpc_port}}}
  memory: {{process: {{size: 1024m}}}}
  execution: {{failover-strategy: region}}
taskmanager:
  bind-host: 127.0.0.1
  host: 127.0.0.1
  numberOfTaskSlots: {slots}
  memory: {{process: {{size: 1536m}}}}
parallelism: {{default: 1}}
rest: {{address: 127.0.0.1, bind-address: 127.0.0.1, port: {rest_port}}}
blob: {{server: {{port: "{blob_port}"}}}}
heartbeat: {{interval: 2000, timeout: 10000}}
restart-strategy: {{type: fixed-delay, fixed-delay: {{attempts: 5, delay: 2 s}}}}
"""


@dataclass(frozen=True)
class Cluster:
    """Where a cluster lives and listens."""

    directory: str
    rest_port: int = 8081
    pool_port: int = 50000
    slots: int = 2

    @property
    def master(self) -> str:
        return f"127.0.0.1:{self.rest_port}"

    @property
    def pool(self) -> str:
        return f"127.0.0.1:{self.pool_port}"

    def run_options(self) -> list[str]:
        """The ``fanin run`` options that submit a job to this cluster."""
        return ["--runner=FlinkRunner", f"--flink_master={self.master}",
                "--environment_type=EXTERNAL", f"--environment_config={self.pool}"]

    def pid_file(self, role: str) -> str:
        """``role``: ``standalonesession`` (JobManager), ``taskexecutor`` or ``pool``."""
        if role == "pool":
            return os.path.join(self.directory, "pool.pid")
        user = os.environ.get("USER", "")
        return os.path.join(self.directory, f"flink-{user}-{role}.pid")

    def pid(self, role: str) -> int | None:
        """The live process of ``role`` its pid file names (None if it has no pid file, or
        names no live process that is this cluster's ``role``: ``ours``)."""
        try:
            with open(self.pid_file(role), encoding="ascii") as handle:
                pids = [int(p) for p in handle.read().split()]
        except (OSError, ValueError):
            return None
        for pid in reversed(pids):
            if pid > 1 and self.ours(role, pid):
                return pid
        return None

    def ours(self, role: str, pid: int) -> bool:
        """Whether process ``pid`` runs and is this cluster's ``role``, by its command line:
        a pid file can outlive its process, and the pid then name another (or say -1)."""
        args = _arguments(pid)
        if args is None:
            return False
        if role == "pool":
            return "apache_beam.runners.worker.worker_pool_main" in args and \
                f"--service_port={self.pool_port}" in args
        entry = {"standalonesession":
                 "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint",
                 "taskexecutor": "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"}[role]
        return entry in args and os.path.join(self.directory, "conf") in args

    def overview(self) -> dict[str, Any] | None:
        """The REST API's ``/overview`` (None if the JobManager does not answer)."""
        try:
            with urllib.request.urlopen(f"http://{self.master}/overview", timeout=2) as reply:
                return json.load(reply)
        except (OSError, ValueError):
            return None


def _arguments(pid: int) -> list[str] | None:
    """The arguments of live process ``pid``, else None (without ``/proc``, as ``ps`` shows
    them: split at spaces)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
        return [arg.decode("utf-8", "surrogateescape") for arg in raw.split(b"\0") if arg] \
            or None
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None  # /proc is there: no such process
    except OSError:
        return None
    try:  # no /proc (macOS)
        found = subprocess.run(["ps", "-p", str(pid), "-o", "command="],  # noqa: S603, S607
                               capture_output=True, text=True, check=False)
    except OSError:
        return None
    return found.stdout.split() or None


def _env(cluster: Cluster) -> dict[str, str]:
    return {**os.environ, "FLINK_CONF_DIR": os.path.join(cluster.directory, "conf"),
            "FLINK_LOG_DIR": os.path.join(cluster.directory, "log"),
            "FLINK_PID_DIR": cluster.directory}


def _write_config(cluster: Cluster, home: str) -> None:
    conf = os.path.join(cluster.directory, "conf")
    os.makedirs(conf, exist_ok=True)
    os.makedirs(os.path.join(cluster.directory, "log"), exist_ok=True)
    java_opts = ""
    with open(os.path.join(home, "conf", "config.yaml"), encoding="utf-8") as shipped:
        for line in shipped:
            if line.strip().startswith("all:"):
                java_opts = line.split("all:", 1)[1].strip()
    text = _CONFIG.format(java_opts=java_opts, rpc_port=cluster.rest_port + 1,
                          blob_port=cluster.rest_port + 2, rest_port=cluster.rest_port,
                          slots=cluster.slots)
    with open(os.path.join(conf, "config.yaml"), "w", encoding="utf-8") as handle:
        handle.write(text)
    for name in os.listdir(os.path.join(home, "conf")):
        if name.startswith(("log4j", "logback")):
            with open(os.path.join(home, "conf", name), "rb") as src, \
                    open(os.path.join(conf, name), "wb") as dst:
                dst.write(src.read())


def start(cluster: Cluster, timeout_s: float = 90.0, say: Any = print) -> Cluster:
    """Start (or repair) the cluster; returns once a TaskManager is registered with its slots
    (Flink lists it a moment before its slots)."""
    from fanin.runners.toolchain import flink_home

    if cluster.pid("pool") is None and not _free(cluster.pool_port):
        raise RuntimeError(f"port {cluster.pool_port} (--pool-port) is in use: the Beam worker "
                           "pool could not listen there")
    home = flink_home()
    if not os.path.isfile(os.path.join(home, "bin", "jobmanager.sh")):
        raise RuntimeError(f"no Flink distribution at {home}: run `fanin setup flink` first")
    _write_config(cluster, home)
    env = _env(cluster)
    for role, script in (("standalonesession", "jobmanager.sh"),
                         ("taskexecutor", "taskmanager.sh")):
        if cluster.pid(role) is None:
            subprocess.run([os.path.join(home, "bin", script), "start"], env=env, check=True,  # noqa: S603
                           capture_output=True)
            say(f"flink-cluster: started {script[:-3]}")
        else:
            say(f"flink-cluster: {script[:-3]} already running (pid {cluster.pid(role)})")
    if cluster.pid("pool") is None:
        path = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        with open(os.path.join(cluster.directory, "log", "worker_pool.log"), "ab") as log:
            pool = subprocess.Popen(  # noqa: S603
                [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                 f"--service_port={cluster.pool_port}"], env={**env, "PATH": path},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with open(cluster.pid_file("pool"), "w", encoding="ascii") as handle:
            handle.write(str(pool.pid))
        say(f"flink-cluster: starting the Beam worker pool on {cluster.pool}")
    else:
        pool = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pool is not None and pool.poll() is not None:
            os.remove(cluster.pid_file("pool"))
            raise RuntimeError(f"flink-cluster: the Beam worker pool exited at its start (exit "
                               f"code {pool.returncode}); see "
                               f"{os.path.join(cluster.directory, 'log', 'worker_pool.log')}")
        view = cluster.overview()
        if view and view.get("taskmanagers", 0) >= 1 and view.get("slots-total", 0) >= 1 \
                and not _free(cluster.pool_port):  # the pool listens
            say(f"flink-cluster: ready (Flink {view.get('flink-version')}, "
                f"{view.get('slots-total')} slots); submit with: "
                f"fanin run ... {' '.join(cluster.run_options())}")
            return cluster
        time.sleep(0.5)
    raise RuntimeError(f"flink-cluster: no TaskManager registered, or no worker pool "
                       f"listening, within {timeout_s:.0f} s; see "
                       f"{os.path.join(cluster.directory, 'log')}")


def _free(port: int) -> bool:
    """Nothing listens on ``port`` of 127.0.0.1 (a connection is refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        return probe.connect_ex(("127.0.0.1", port)) != 0


def stop(cluster: Cluster, say: Any = print) -> None:
    """End the cluster's processes: those its pid files name that still run and are this
    cluster's (``Cluster.ours``); a pid file that names none is removed, nothing signalled."""
    for role in ("pool", "taskexecutor", "standalonesession"):
        pid = cluster.pid(role)
        if pid is None:
            if os.path.exists(cluster.pid_file(role)):
                os.remove(cluster.pid_file(role))
                say(f"flink-cluster: {role}: its pid file names no process of this cluster; "
                    "removed it, signalled nothing")
            continue
        if role == "pool":  # its own session: the SDK workers it spawned end with it
            os.killpg(pid, signal.SIGTERM)
        else:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while cluster.pid(role) == pid and time.monotonic() < deadline:
            time.sleep(0.2)
        if cluster.pid(role) == pid:
            os.kill(pid, signal.SIGKILL)
        os.remove(cluster.pid_file(role))
        say(f"flink-cluster: stopped {role} (pid {pid})")


def _command(args: argparse.Namespace) -> int:
    cluster = Cluster(os.path.abspath(args.dir), args.rest_port, args.pool_port, args.slots)
    own = range(args.rest_port, args.rest_port + 3)
    if args.pool_port in own:
        print(f"fanin: error: --pool-port {args.pool_port} is one of the cluster's own ports "
              f"(--rest-port and the next two: {own.start}-{own.stop - 1})", file=sys.stderr)
        return 2
    if not _can_be_folder(args.dir):
        print(f"fanin: error: --dir {args.dir!r} is not a folder", file=sys.stderr)
        return 2
    try:
        if args.action == "start":
            start(cluster, args.timeout_s)
        elif args.action == "stop":
            stop(cluster)
        else:
            print(json.dumps(cluster.overview()))
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        print(f"fanin: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


def _can_be_folder(path: str) -> bool:
    """``path`` is a folder, or can be made one (its nearest existing ancestor is a folder)."""
    return bool(path) and os.path.isdir(nearest_existing(path))


def _int_in(low: int, high: int) -> Any:
    """An ``argparse`` type: an integer in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], not {text}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def add_subcommand(subparsers: Any) -> None:
    """Register ``flink-cluster`` on an ``argparse`` subparsers object."""
    parser = subparsers.add_parser(
        "flink-cluster", help="start/stop a local multi-process Flink cluster",
        description="A JobManager, a TaskManager and a Beam worker pool on 127.0.0.1 "
                    "(after `fanin setup flink`).")
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("--dir", default=os.path.expanduser("~/.fanin/flink-cluster"),
                        help="configuration, logs and pid files")
    parser.add_argument("--rest-port", type=_int_in(1, _MAX_PORT - 2), default=8081,
                        help="REST port (the JobManager RPC and blob ports are the next two; "
                             f"1 to {_MAX_PORT - 2})")
    parser.add_argument("--pool-port", type=_int_in(1, _MAX_PORT), default=50000,
                        help=f"Beam worker pool port (1 to {_MAX_PORT})")
    parser.add_argument("--slots", type=_int_in(1, _MAX_SLOTS), default=2,
                        help="task slots of the TaskManager (at least 1)")
    parser.add_argument("--timeout-s", type=positive_seconds, default=90.0,
                        help="start: how long to wait for a TaskManager (seconds > 0)")
    parser.set_defaults(func=_command)
