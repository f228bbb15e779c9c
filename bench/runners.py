"""Benchmark: the same Fanin job on every runner (docs/runners.md, "Throughput").

Usage: ``python bench/runners.py [--joins 1000] [--repeats 3] [--only fnapi,prism,...]``
(after ``fanin setup all``).

The workload is ``fanin simulate --joins N --seed 5 --showcase`` with the bundled contracts.
Each runner runs it bounded and as a replay (``--replay --close-trigger watermark``, with a
``--max-disorder-s`` that leaves no message behind the watermark), as
``fanin run`` in a fresh process, ``--repeats`` times, alternating runners so machine noise hits
them alike. The figure is input messages / wall-clock seconds of the whole ``fanin run``
(runner start-up included: what a user waits for), median of the repeats. The Flink cluster
(JobManager, TaskManager, worker pool) is started once before and stopped after; its start-up
is not counted, a job submission is. Every run's outputs are checked to hold the same closes,
late and dead letters as the first runner's (a fast runner that is wrong is no figure).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fanin.contracts.catalog import load_contracts  # noqa: E402
from fanin.contracts.parsing import DEFAULT_MAX_BYTES  # noqa: E402
from fanin.runners.flink_cluster import Cluster, start, stop  # noqa: E402
from fanin.transforms.read import numbered_lines  # noqa: E402
from fanin.transforms.replay import MessageScan, covering_disorder_s  # noqa: E402

RUNNERS = {
    "fnapi": {"bounded": ["--runner=FnApiRunner"],
              "replay": ["--runner=BundleBasedDirectRunner", "--streaming"]},
    "prism": {"bounded": ["--runner=PrismRunner"], "replay": ["--runner=PrismRunner"]},
    "flink-local": {mode: ["--runner=FlinkRunner", "--flink_master=[local]",
                           "--environment_type=LOOPBACK", "--parallelism=2"]
                    for mode in ("bounded", "replay")},
    "flink-cluster": {},  # filled in once the cluster runs
}
MODES = {"bounded": [], "replay": ["--replay", "--close-trigger", "watermark"]}


def on_time_disorder_s(path: Path) -> float:
    """The smallest whole ``--max-disorder-s`` that puts no message behind the replay's
    watermark (data behind it is counted late or not depending on the runner: docs/runners.md)."""
    scan = MessageScan(frozenset(load_contracts(str(ROOT / "fanin/examples/contracts.yaml"))),
                        DEFAULT_MAX_BYTES)
    return covering_disorder_s(numbered_lines(str(path)), scan)


def _outputs(out: Path) -> dict[str, Counter[str]]:
    return {kind: Counter(json.dumps(json.loads(line), sort_keys=True)
                          for f in (out / kind).glob("*.jsonl")
                          for line in f.read_text(encoding="utf-8").splitlines())
            for kind in ("closes", "late", "dead_letter")}


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--joins", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=",".join(RUNNERS))
    args = parser.parse_args()
    chosen = args.only.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        traffic = Path(tmp) / "traffic.jsonl"
        subprocess.run([sys.executable, "-m", "fanin.cli", "simulate", "--joins",
                        str(args.joins), "--seed", "5", "--showcase", "--out", str(traffic)],
                       check=True)
        messages = sum(1 for _ in numbered_lines(str(traffic)))
        MODES["replay"].append(f"--max-disorder-s={on_time_disorder_s(traffic)}")
        cluster = None
        if "flink-cluster" in chosen:
            cluster = start(Cluster(str(Path(tmp) / "cluster"), _port(), _port()),
                            say=lambda _line: None)
            RUNNERS["flink-cluster"] = {m: [*cluster.run_options(), "--parallelism=2"]
                                        for m in MODES}
        times: dict[tuple[str, str], list[float]] = {}
        expected: dict[str, dict[str, Counter[str]]] = {}
        try:
            for _ in range(args.repeats):
                for mode, extra in MODES.items():
                    for runner in chosen:
                        out = Path(tmp) / f"{runner}-{mode}"
                        cmd = [sys.executable, "-m", "fanin.cli", "run", "--input",
                               str(traffic), "--contracts",
                               str(ROOT / "fanin/examples/contracts.yaml"), "--output",
                               str(out), "--overwrite", *extra, *RUNNERS[runner][mode]]
                        began = time.perf_counter()
                        subprocess.run(cmd, check=True, capture_output=True)
                        times.setdefault((runner, mode), []).append(time.perf_counter() - began)
                        got = _outputs(out)
                        assert expected.setdefault(mode, got) == got, f"{runner} {mode} differs"
        finally:
            if cluster is not None:
                stop(cluster, say=lambda _line: None)
    print(f"{messages} messages ({args.joins} joins), median of {args.repeats}, messages/s "
          "(wall clock of fanin run, start-up included)")
    print("| runner | bounded | replay |\n|---|---:|---:|")
    for runner in chosen:
        cells = [f"{messages / statistics.median(times[runner, m]):,.0f} "
                 f"({statistics.median(times[runner, m]):.1f} s)" for m in MODES]
        print(f"| {runner} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
