"""Benchmark: Fanin through Google's Pub/Sub emulator (see docs/performance.md, "Pub/Sub").

Usage: ``python bench/pubsub.py [--joins 2000] [--latency-joins 30]`` (needs the emulator:
``gcloud beta emulators pubsub start``, Debian package google-cloud-cli-pubsub-emulator; it is
started on a free 127.0.0.1 port by the tests' fixture code, ``tests/support/emulator.py``).

1. ``fanin publish`` throughput: a file of ``--joins`` complete joins (an open and two
   receipts each, current event times) published by the real command; messages / wall
   seconds of the whole process (interpreter start included), next to the wall time of a
   1-message publish (the fixed cost).
2. ``fanin run --subscription`` throughput: the job is started on the backlog left by step 1;
   messages / seconds from the first to the last ``join_closed`` event it logs
   (``--log-closes``; every join closes eagerly on its last receipt). ``--deadline-s 3600``:
   the backlog is older than the 30 s default deadline by the time it is read, and a receipt
   pulled before its open (Pub/Sub does not keep order) would otherwise be decided at once,
   without an open (``undefined_join``), the local watermark being the clock.
3. Close latency: with the job running, ``--latency-joins`` joins are published live, each with
   a 2 s deadline and one of its two receipts, one every 0.1 s; each times out. Latency = the
   time its close is pulled from ``--closes-topic`` minus its close time (opened_at + 2 s).
   Also for joins completed by their last receipt: pulled - publish time of that receipt.
   The same for the output files: the time a close is first seen in a file of ``DIR/closes``
   (polled every 0.2 s; ``--window-s 5``, so a file per 5 s of processing time).
Figures print as a small table; nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.emulator import PubSubEmulator
from support.streaming_run import FaninRun

from fanin.contracts.timefmt import format_ms, parse_rfc3339

FANIN = [sys.executable, "-m", "fanin.cli"]
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _join_lines(join_id: str, at_ms: int, receipts: tuple[str, ...], deadline_s: float) -> list:
    lines = [{"kind": "open", "join_id": join_id, "opened_at": format_ms(at_ms),
              "required": ["a", "b"], "deadline_s": deadline_s}]
    lines += [{"join_id": join_id, "branch": b, "status": "ok", "event_time": format_ms(at_ms),
               "value": 1} for b in receipts]
    return lines


def _publish_file(topic: str, path: Path) -> float:
    started = time.monotonic()
    done = subprocess.run([*FANIN, "publish", "--topic", topic, "--progress-every", "0",
                           str(path)], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("sent="), done
    return time.monotonic() - started


def _close_log_times(stderr: str) -> list[float]:
    times = []
    for line in stderr.splitlines():
        match = _LOG_TIME.match(line)
        if match and '"event": "join_closed"' in line:
            times.append(datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--joins", type=int, default=2000)
    parser.add_argument("--latency-joins", type=int, default=30)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="fanin-bench-pubsub-"))
    emulator = PubSubEmulator(folder / "emulator")
    emulator.start()
    import os

    os.environ["PUBSUB_EMULATOR_HOST"] = emulator.host
    try:
        topic, subscription = emulator.topic_and_subscription("bench-in", ack_deadline_s=60)
        closes_topic, closes_sub = emulator.topic_and_subscription("bench-closes")
        now = _now_ms()
        traffic = folder / "traffic.jsonl"
        lines = [line for j in range(args.joins)
                 for line in _join_lines(f"b-{j}", now, ("a", "b"), 600)]
        traffic.write_text("".join(json.dumps(line) + "\n" for line in lines))
        one = folder / "one.jsonl"
        one.write_text(json.dumps(lines[0]) + "\n")
        # the extra open is harmless: it is a duplicate of b-0's
        startup = _publish_file(topic, one)
        wall = _publish_file(topic, traffic)
        messages = len(lines)
        print(f"fanin publish: {messages} messages in {wall:.2f} s wall, interpreter start "
              f"included ({messages / wall:,.0f} msg/s); a 1-message publish took "
              f"{startup:.2f} s")

        run = FaninRun(["--subscription", subscription, "--output", str(folder / "out"),
                        "--closes-topic", closes_topic, "--window-s", "5", "--log-closes",
                        "--deadline-s", "3600"],
                       folder / "run")
        try:
            ok = run.until(lambda: len(_close_log_times(run.stderr())) >= args.joins, 1800)
            assert ok, run.stderr()[-2000:]
            times = _close_log_times(run.stderr())
            span = max(times) - min(times)
            print(f"fanin run --subscription: {args.joins} joins ({messages + 1} messages) "
                  f"closed in {span:.2f} s from the first close to the last "
                  f"({(messages + 1) / span:,.0f} msg/s consumed)")
            emulator.collect(closes_sub, lambda got: len(got) >= args.joins, 600)

            timeouts: dict[str, float] = {}
            completes: dict[str, float] = {}
            for j in range(args.latency_joins):
                at = _now_ms()
                for line in _join_lines(f"t-{j}", at, ("a",), 2):
                    emulator.publish(topic, json.dumps(line).encode(), event_time=format_ms(at))
                timeouts[f"t-{j}"] = at / 1000 + 2
                for line in _join_lines(f"c-{j}", at, ("a", "b"), 600):
                    emulator.publish(topic, json.dumps(line).encode(), event_time=format_ms(at))
                completes[f"c-{j}"] = time.time()
                time.sleep(0.1)  # pacing of a live stream (a benchmark, not a test)
            latencies: dict[tuple[str, str], list[float]] = {
                (kind, to): [] for to in ("--closes-topic", "files") for kind in
                ("timeout", "complete")}
            seen_files: set[Path] = set()

            def record(close: dict, received: float, to: str) -> None:
                join_id = close["join_id"]
                if join_id in timeouts:
                    closed_at = parse_rfc3339(close["closed_at"]) / 1000
                    assert abs(closed_at - timeouts[join_id]) < 0.01, close
                    latencies["timeout", to].append(received - timeouts[join_id])
                elif join_id in completes:
                    latencies["complete", to].append(received - completes[join_id])

            def collect() -> bool:
                received = time.time()
                for message in emulator.pull(closes_sub):
                    record(json.loads(message.data), received, "--closes-topic")
                for path in sorted(set((folder / "out" / "closes").glob("*.jsonl")) - seen_files):
                    seen_files.add(path)
                    for line in path.read_text().splitlines():
                        record(json.loads(line), received, "files")
                return sum(map(len, latencies.values())) >= 4 * args.latency_joins

            assert run.until(collect, 300), run.stderr()[-2000:]
            for (kind, to), values in latencies.items():
                values.sort()
                print(f"close latency ({kind}, {len(values)} joins, to {to}): "
                      f"median {statistics.median(values):.2f} s, "
                      f"p90 {values[int(0.9 * (len(values) - 1))]:.2f} s, "
                      f"max {values[-1]:.2f} s")
            run.signal(signal.SIGINT)
            drained = time.monotonic()
            assert run.wait(600) == 0, run.stderr()[-2000:]
            print(f"drain after SIGINT: exit 0 in {time.monotonic() - drained:.2f} s")
        finally:
            run.stop()
    finally:
        emulator.stop()


if __name__ == "__main__":
    main()
