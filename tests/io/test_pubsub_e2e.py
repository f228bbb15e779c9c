"""End to end against Google's Pub/Sub emulator, as a user runs it: ``fanin publish`` sends
opens and receipts with current event times, a streaming ``fanin run --subscription`` joins
them, closes / late lines / dead letters come back on their topics and reach ``--output`` while
the job runs, and a Ctrl-C drains it: exit 0 with every output in ``--output``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from support.emulator import PubSubEmulator
from support.streaming_run import FaninRun, read_outputs

from fanin.contracts.timefmt import format_ms

DEADLINE_S = 90.0


def _traffic(now_ms: int) -> list[dict[str, Any] | str]:
    """3 complete joins, 2 that time out after 10 s, a redelivery after a close, a bad line."""
    lines: list[dict[str, Any] | str] = []
    for j in range(5):
        join_id = f"pj-{j}"
        lines.append({"kind": "open", "join_id": join_id, "opened_at": format_ms(now_ms),
                      "required": ["retrieve", "rank"], "deadline_s": 10, "run_id": "e2e"})
        branches = ("retrieve", "rank") if j < 3 else ("retrieve",)
        for i, branch in enumerate(branches):
            lines.append({"join_id": join_id, "branch": branch, "status": "ok",
                          "event_time": format_ms(now_ms + 1 + i), "value": f"{branch}-{j}"})
    lines.insert(0, lines.pop(1))  # a receipt before its open
    lines += [line for line in lines if isinstance(line, dict) and line["join_id"] == "pj-2"
              and line.get("branch") == "rank"]  # pj-2's last receipt again, after its close
    lines.append("{not json")
    return lines


def test_publish_run_and_drain_over_the_emulator(
    pubsub_emulator: PubSubEmulator, tmp_path: Path
) -> None:
    topic_in, sub_in = pubsub_emulator.topic_and_subscription("receipts")
    outs = {kind: pubsub_emulator.topic_and_subscription(kind)
            for kind in ("closes", "late", "dead-letter")}
    output = tmp_path / "out"
    run = FaninRun(["--subscription", sub_in, "--output", str(output), "--window-s", "1",
                    *(arg for kind, (topic, _) in outs.items()
                      for arg in (f"--{kind}-topic", topic))], tmp_path / "run")
    try:
        # Warm-up: once a join published now comes back closed, the job is reading. (The local
        # runner's watermark is the clock at each pull: traffic that waited in the subscription
        # past its deadlines while the job started would close by timeout, its receipts late.)
        warm_up = [{"kind": "open", "join_id": "warm-up", "opened_at": format_ms(
            int(time.time() * 1000)), "required": ["a"]}]
        warm_up.append({"join_id": "warm-up", "branch": "a", "status": "ok",
                        "event_time": warm_up[0]["opened_at"]})
        for message in warm_up:
            pubsub_emulator.publish(topic_in, json.dumps(message).encode())
        closes_sub = outs["closes"][1]
        assert run.until(lambda: pubsub_emulator.pull(closes_sub), DEADLINE_S), run.stderr()
        traffic = tmp_path / "traffic.jsonl"
        traffic.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                                   for line in _traffic(int(time.time() * 1000))))
        published = subprocess.run(
            [sys.executable, "-m", "fanin.cli", "publish", "--topic", topic_in, str(traffic)],
            capture_output=True, text=True, timeout=DEADLINE_S)
        assert published.returncode == 0, published.stderr
        assert published.stdout.split() == ["sent=15", "failed=0"]

        got: dict[str, list[Any]] = {kind: [] for kind in outs}

        def arrived() -> bool:
            for kind, (_, sub) in outs.items():
                got[kind].extend(pubsub_emulator.pull(sub))
            wanted = {"closes": 5, "late": 1, "dead-letter": 1}
            return all(len(got[kind]) >= n for kind, n in wanted.items())

        # Closes (eager ones and the 10 s deadlines), the late line and the dead letter come
        # back on their topics while the job runs.
        assert run.until(arrived, DEADLINE_S), run.stderr()

        # ... and in the output folder, still while the job runs: a file per shard every
        # --window-s (before, the local runner wrote the first such file only, then waited
        # for the drain)
        def in_files() -> bool:
            return [len(read_outputs(output, kind)) for kind in ("closes", "late", "dead_letter")
                    ] == [6, 1, 1]

        assert run.until(in_files, DEADLINE_S), run.stderr()
        assert run.running
        run.signal(signal.SIGINT)
        assert run.wait(DEADLINE_S) == 0, run.stderr()
    finally:
        run.stop()
    closes = [json.loads(m.data) for m in got["closes"]]
    assert sorted((c["join_id"], c["reason"]) for c in closes) == [
        ("pj-0", "complete"), ("pj-1", "complete"), ("pj-2", "complete"),
        ("pj-3", "timeout"), ("pj-4", "timeout")]
    assert all(c["run_id"] == "e2e" for c in closes)
    assert {m.attributes["join_id"] for m in got["closes"]} == {c["join_id"] for c in closes}
    late = [json.loads(m.data) for m in got["late"]]
    assert [(x["join_id"], x["reason"]) for x in late] == [("pj-2", "after_close")]
    (dead,) = [json.loads(m.data) for m in got["dead-letter"]]
    assert dead["error"] == "invalid_json" and dead["source"]["message_id"]
    # The same outputs in the output folder once drained, and the summary line.
    assert sorted(c["join_id"] for c in read_outputs(output, "closes")) == sorted(
        ["warm-up"] + [c["join_id"] for c in closes])
    assert read_outputs(output, "late") == late
    assert read_outputs(output, "dead_letter") == [dead]
    assert "fanin: done: closes=6 late=1 dead_letter=1" in run.stderr()
