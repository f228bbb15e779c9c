"""Stopping a streaming ``fanin run`` without losing data, against Google's Pub/Sub emulator.

The local runner acknowledges each pulled batch at once (``fanin/io/pubsub_drain.py``), so a
stop is a drain: SIGINT/SIGTERM stops reading, every open join closes as at its deadline, the
outputs are written and the process exits 0. Messages not yet read stay in the subscription
for the next run. Accounting across runs: every published message is counted exactly once in
a close's ``counts.messages``, a late line or a dead letter.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from support.emulator import PubSubEmulator
from support.streaming_run import FaninRun, read_outputs

from fanin.contracts.timefmt import format_ms

DEADLINE_S = 90.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _open(join_id: str, deadline_s: float) -> dict[str, Any]:
    return {"kind": "open", "join_id": join_id, "opened_at": format_ms(_now_ms()),
            "required": ["a", "b"], "deadline_s": deadline_s}


def _receipt(join_id: str, branch: str) -> dict[str, Any]:
    return {"join_id": join_id, "branch": branch, "status": "ok",
            "event_time": format_ms(_now_ms()), "value": f"{join_id}/{branch}"}


def _publish(emulator: PubSubEmulator, topic: str, messages: list[Any]) -> None:
    futures = []
    for message in messages:
        if isinstance(message, bytes):
            futures.append(emulator.publisher.publish(topic, message))
            continue
        stamp = message.get("event_time") or message["opened_at"]
        futures.append(emulator.publisher.publish(topic, json.dumps(message).encode(),
                                                  event_time=stamp))
    for future in futures:
        future.result(timeout=30)


def _accounted(outputs: list[Path]) -> dict[str, int]:
    closes = [c for out in outputs for c in read_outputs(out, "closes")]
    return {
        "messages": sum(c["counts"]["messages"] for c in closes),
        "duplicates": sum(c["counts"]["duplicates"] for c in closes),
        "late": sum(len(read_outputs(out, "late")) for out in outputs),
        "dead_letter": sum(len(read_outputs(out, "dead_letter")) for out in outputs),
    }


def _closes(output: Path) -> dict[str, dict[str, Any]]:
    return {c["join_id"]: c for c in read_outputs(output, "closes")}


def _start(subscription: str, output: Path, folder: Path) -> FaninRun:
    return FaninRun(["--subscription", subscription, "--output", str(output), "--window-s", "1",
                     "--log-closes"], folder)


def _logged_closes(run: FaninRun) -> set[str]:
    """The join ids of the ``join_closed`` events the run logged so far (``--log-closes``)."""
    events = (json.loads(line[line.index("{"):]) for line in run.stderr().splitlines()
              if '"event": "join_closed"' in line)
    return {event["join_id"] for event in events}


def _published_joins(emulator: PubSubEmulator, name: str, joins: int
                     ) -> tuple[str, list[Any]]:
    """A new subscription holding ``joins`` complete joins (600 s deadlines): its path and
    the messages published."""
    topic, subscription = emulator.topic_and_subscription(name)
    messages: list[Any] = []
    for i in range(joins):
        join_id = f"{name}-{i}"
        messages += [_open(join_id, 600), _receipt(join_id, "a"), _receipt(join_id, "b")]
    _publish(emulator, topic, messages)
    return subscription, messages


def _launched(subscription: str, output: Path, folder: Path, launcher: str,
              env: dict[str, str] | None = None) -> FaninRun:
    """A run of ``subscription`` through a test double of ``tests/support``."""
    return FaninRun(["--subscription", subscription, "--output", str(output), "--window-s",
                     "1"], folder, env=env, launcher=Path(__file__).parents[1] / "support" /
                    launcher)


def _stopped_once_closed(subscription: str, output: Path, folder: Path, join_id: str,
                         sig: int) -> FaninRun:
    """A run of ``subscription`` that gets ``sig`` once it logged the close of ``join_id``,
    and exits 0 (a drain)."""
    run = _start(subscription, output, folder)
    try:
        assert run.until(lambda: join_id in _logged_closes(run), DEADLINE_S), run.stderr()
        run.signal(sig)
        assert run.wait(DEADLINE_S) == 0, run.stderr()
    finally:
        run.stop()
    return run


def test_stop_drains_and_a_second_run_gets_the_rest(
    pubsub_emulator: PubSubEmulator, tmp_path: Path
) -> None:
    topic, subscription = pubsub_emulator.topic_and_subscription("stop")
    short = [f"short-{i}" for i in range(12)]
    long = [f"long-{i}" for i in range(8)]
    first: list[Any] = []
    for join_id in long:
        receipt = _receipt(join_id, "a")
        first += [_open(join_id, 600), receipt, receipt]  # a redelivered receipt
    for join_id in short:  # published last: once they closed, `first` was read
        first += [_open(join_id, 600), _receipt(join_id, "a"), _receipt(join_id, "b")]
    first.append(b"{not json")
    second = [_receipt(join_id, "b") for join_id in long]
    sentinel = [_open("sentinel", 600), _receipt("sentinel", "a"), _receipt("sentinel", "b")]
    published = len(first) + len(second) + len(sentinel)

    out = tmp_path / "out"
    _publish(pubsub_emulator, topic, first)
    run1 = _start(subscription, out, tmp_path / "run1")
    try:
        assert run1.until(lambda: set(short) <= _logged_closes(run1), DEADLINE_S), run1.stderr()
        assert not set(long) & _logged_closes(run1)  # still open: a 600 s deadline
        _publish(pubsub_emulator, topic, second)
        run1.signal(signal.SIGINT)  # mid-way: some of `second` may be read, the rest wait
        assert run1.wait(DEADLINE_S) == 0, run1.stderr()
    finally:
        run1.stop()
    assert "draining" in run1.stderr() and "Traceback" not in run1.stderr()
    closes1 = _closes(out)
    # The drain closed every join that held messages, as at its deadline.
    assert set(closes1) == set(short) | set(long)
    assert {closes1[j]["reason"] for j in short} == {"complete"}
    for join_id in long:
        assert closes1[join_id]["reason"] in {"complete", "timeout"}
        assert closes1[join_id]["counts"]["duplicates"] == 1
    read_in_run1 = {j for j in long if closes1[j]["reason"] == "complete"}

    files1 = {path: path.read_bytes() for path in out.rglob("*.jsonl")}
    # The next run continues into the same folder (no --overwrite): its files join run 1's
    run2 = _start(subscription, out, tmp_path / "run2")
    try:
        _publish(pubsub_emulator, topic, sentinel)  # published last: read after the backlog
        assert run2.until(lambda: "sentinel" in _logged_closes(run2), DEADLINE_S), run2.stderr()
        run2.signal(signal.SIGTERM)
        assert run2.wait(DEADLINE_S) == 0, run2.stderr()
    finally:
        run2.stop()
    # The receipts run 1 did not read arrive in run 2, whose joins have no open there: dead
    # letters (undefined_join), as the reference says for receipts without an open.
    assert set(_closes(out)) == set(closes1) | {"sentinel"}
    assert {path: path.read_bytes() for path in files1} == files1  # run 1's files kept
    undefined = [d["source"]["message_id"] for d in read_outputs(out, "dead_letter")
                 if d["error"] == "undefined_join"]
    assert len(undefined) == len(set(long) - read_in_run1)
    # run 2's summary counts its own outputs only
    assert f"fanin: done: closes=1 late=0 dead_letter={len(undefined)};" in run2.stderr()
    # Every message exactly once across both runs; the redeliveries counted as duplicates.
    accounted = _accounted([out])
    assert accounted["messages"] + accounted["late"] + accounted["dead_letter"] == published
    assert accounted["duplicates"] == len(long)
    assert accounted["dead_letter"] == len(undefined) + 1  # and the malformed line
    assert pubsub_emulator.pull(subscription) == []


def test_a_backlog_is_read_before_the_clock_decides_its_joins(
    pubsub_emulator: PubSubEmulator, tmp_path: Path
) -> None:
    """Messages waiting in the subscription when the run starts, its deadline passed: the open
    of j (5 s), 600 other joins' opens, then j's receipts (event times within the deadline).
    The read pulls at most 100 at a time from the emulator; with the watermark at the clock
    after the first pull, j closed as a timeout before its receipts were read (they were
    late). While pulls bring messages the watermark follows their publish times: j
    completes."""
    topic, subscription = pubsub_emulator.topic_and_subscription("backlog")
    opened = _now_ms()
    at = format_ms(opened)
    messages = [{"kind": "open", "join_id": "j", "opened_at": at, "required": ["a", "b"],
                 "deadline_s": 5}]
    messages += [{"kind": "open", "join_id": f"other-{i}", "opened_at": at, "required": []}
                 for i in range(600)]
    messages += [{"join_id": "j", "branch": branch, "status": "ok",
                  "event_time": format_ms(opened + 100)} for branch in ("a", "b")]
    _publish(pubsub_emulator, topic, messages)
    while _now_ms() <= opened + 5_000:  # the run starts once j's deadline has passed
        time.sleep(0.1)
    out = tmp_path / "out"
    _stopped_once_closed(subscription, out, tmp_path / "run", "j", signal.SIGINT)
    close = _closes(out)["j"]
    assert (close["reason"], close["counts"]["messages"]) == ("complete", 3)
    assert read_outputs(out, "late") == []


def test_a_signal_while_the_job_starts_drains_what_was_read(
    pubsub_emulator: PubSubEmulator, tmp_path: Path
) -> None:
    """A Ctrl-C in the first moments of a run, once the read has acknowledged a pull but before
    Beam's ``Pipeline.run`` returned, drains like any other: the run exits 0 with every message
    it read in its outputs and the rest left in the subscription. (The drain's handler was
    installed only after ``run`` returned: that Ctrl-C was "interrupted before it wrote
    anything", exit 130, and the pulled messages were in no output and no longer in the
    subscription.) ``tests/support/sigint_in_run.py`` places the signal there."""
    subscription, messages = _published_joins(pubsub_emulator, "early", 40)
    out = tmp_path / "out"
    run = _launched(subscription, out, tmp_path / "run", "sigint_in_run.py")
    try:
        assert run.wait(DEADLINE_S) == 0, run.stderr()
    finally:
        run.stop()
    assert "draining" in run.stderr() and "Traceback" not in run.stderr(), run.stderr()
    accounted = _accounted([out])
    assert accounted["messages"] > 0, run.stderr()  # it read some before the signal
    left = pubsub_emulator.collect(subscription, lambda got: False, 2.0)
    assert accounted["messages"] + accounted["late"] + accounted["dead_letter"] + len(left) \
        == len(messages)


def test_sighup_drains_like_sigterm(pubsub_emulator: PubSubEmulator, tmp_path: Path) -> None:
    """The terminal closing (SIGHUP, sent to a job started with ``&`` when its shell exits)
    killed the run: exit 129, no line, every acknowledged message in no output. It drains."""
    topic, subscription = pubsub_emulator.topic_and_subscription("hangup")
    waiting = [f"waiting-{i}" for i in range(5)]
    messages: list[Any] = [m for j in waiting for m in (_open(j, 600), _receipt(j, "a"))]
    messages += [_open("sentinel", 600), _receipt("sentinel", "a"), _receipt("sentinel", "b")]
    _publish(pubsub_emulator, topic, messages)
    out = tmp_path / "out"
    run = _stopped_once_closed(subscription, out, tmp_path / "run", "sentinel", signal.SIGHUP)
    assert "SIGHUP: draining" in run.stderr() and "Traceback" not in run.stderr()
    assert set(_closes(out)) == {*waiting, "sentinel"}
    assert _accounted([out])["messages"] == len(messages)


def test_a_write_that_fails_before_any_file_keeps_the_mark_and_counts_what_was_acknowledged(
    pubsub_emulator: PubSubEmulator, tmp_path: Path
) -> None:
    """Files limited to 4,000 bytes (the run's standard error, a file here, too): the run's
    first write of its closes (40 joins, ~14 KB) fails. The run had
    acknowledged the messages it pulled, which are then in no file and not in the
    subscription; it removed its output folder as a run that changed nothing (no mark, so
    ``fanin query`` said "no such output directory") and said nothing of them. Now the folder
    keeps its mark and the run says how many it acknowledged, before its one line."""
    from fanin.io.output_lock import UNFINISHED, folder_state

    subscription, messages = _published_joins(pubsub_emulator, "full", 40)
    out = tmp_path / "out"
    run = _launched(subscription, out, tmp_path / "run", "small_files.py",
                    {"FANIN_TEST_FILE_LIMIT": "4000"})
    try:
        assert run.wait(DEADLINE_S) == 1, run.stderr()
    finally:
        run.stop()
    lines = run.stderr().strip().splitlines()
    assert lines[-1].startswith("fanin: error: the job failed reading or writing files: "
                                "cannot write ") and "File too large" in lines[-1], lines[-3:]
    counted = [line for line in lines if "were acknowledged before the run stopped" in line]
    assert len(counted) == 1 and f"of {subscription} were acknowledged" in counted[0]
    acknowledged = int(counted[0].split("fanin: ", 1)[1].split(" ", 1)[0])
    assert 1 <= acknowledged <= len(messages)
    assert len(pubsub_emulator.pull(subscription)) == len(messages) - acknowledged
    assert folder_state(str(out)) == UNFINISHED and "Traceback" not in run.stderr()
