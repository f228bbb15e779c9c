"""Faults on the Pub/Sub path, against Google's Pub/Sub emulator.

- A lost acknowledgement (injected: the only test double here): the emulator redelivers the
  batch once its 10 s ack deadline expires, and the join counts the copies as duplicates.
- The emulator down under a running ``fanin run``: the job logs the outage, keeps retrying,
  logs the recovery once the emulator is back, reads again, and a Ctrl-C then drains it with
  every join it had read (before and after) written.
- An output topic deleted under a running job: what cannot be published is logged, the files
  hold it, and the run drains as usual.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from support.emulator import PubSubEmulator, wait_for
from support.streaming_run import FaninRun, read_outputs

from fanin.contracts.timefmt import format_ms
from fanin.io import pubsub_drain
from fanin.io.pubsub_drain import Drain
from fanin.pipelines.pipeline import RunConfig, build, catalog_for

DEADLINE_S = 90.0


def _join(join_id: str, branches: tuple[str, ...], deadline_s: float = 600) -> list[bytes]:
    now = format_ms(int(time.time() * 1000))
    messages: list[dict[str, Any]] = [{"kind": "open", "join_id": join_id, "opened_at": now,
                                       "required": ["a", "b"], "deadline_s": deadline_s}]
    messages += [{"join_id": join_id, "branch": b, "status": "ok", "event_time": now}
                 for b in branches]
    return [json.dumps(m).encode() for m in messages]


def test_a_lost_ack_is_redelivered_and_counted_as_duplicates(
    pubsub_emulator: PubSubEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic, subscription = pubsub_emulator.topic_and_subscription("redeliver", ack_deadline_s=10)
    acked: list[int] = []
    acknowledge = pubsub_drain._IdlePollingClient.acknowledge

    def lose_first_ack(self: Any, subscription: str, ack_ids: list[str]) -> None:
        acked.append(len(ack_ids))
        if len(acked) > 1:  # the first batch's ack is lost: the emulator will redeliver it
            acknowledge(self, subscription, ack_ids)

    monkeypatch.setattr(pubsub_drain._IdlePollingClient, "acknowledge", lose_first_ack)
    messages = _join("r-1", ("a",)) + _join("r-2", ("a",))
    for data in messages:
        pubsub_emulator.publish(topic, data)
    config = RunConfig(output=str(tmp_path / "out"), subscription=subscription, window_s=1)
    p = beam.Pipeline(options=PipelineOptions(["--runner=BundleBasedDirectRunner",
                                               "--streaming"]))
    drain = Drain()
    build(p, config, catalog_for(config), drain)
    result = p.run()
    try:
        # Delivered, ack lost, redelivered after the 10 s deadline and acknowledged.
        assert wait_for(lambda: sum(acked[1:]) >= len(messages), DEADLINE_S, 0.2), acked
        drain.request()
        result.wait_until_finish()
    finally:
        if not drain.requested:
            result.cancel()
    closes = {c["join_id"]: c for c in read_outputs(tmp_path / "out", "closes")}
    assert sorted(closes) == ["r-1", "r-2"]
    for close in closes.values():
        assert close["reason"] == "timeout"  # closed by the drain, b never came
        assert close["counts"] == {"messages": 4, "duplicates": 2, "superseded": 0}
    assert pubsub_emulator.pull(subscription) == []


def test_emulator_restart_under_a_running_job(
    pubsub_emulator: PubSubEmulator, tmp_path: Path
) -> None:
    topic, subscription = pubsub_emulator.topic_and_subscription("restart")
    output = tmp_path / "out"
    run = FaninRun(["--subscription", subscription, "--output", str(output), "--window-s", "1",
                    "--log-closes"], tmp_path / "run")

    def logged(join_id: str) -> bool:
        return f'"join_id": "{join_id}"' in run.stderr()

    try:
        for data in _join("before", ("a", "b")) + _join("open-across", ("a",)):
            pubsub_emulator.publish(topic, data)
        assert run.until(lambda: logged("before"), DEADLINE_S), run.stderr()
        # While it is down the job says so and keeps trying; the emulator comes back without
        # any message it held (the fixture re-creates the topic and subscription).
        pubsub_emulator.restart(while_down=lambda: run.until(
            lambda: "retrying every 1 s" in run.stderr(), DEADLINE_S))
        assert run.until(lambda: "works again" in run.stderr(), DEADLINE_S), run.stderr()
        for data in _join("after", ("a", "b")):
            pubsub_emulator.publish(topic, data)
        assert run.until(lambda: logged("after"), DEADLINE_S), run.stderr()
        run.signal(signal.SIGINT)
        assert run.wait(DEADLINE_S) == 0, run.stderr()
    finally:
        run.stop()
    closes = {c["join_id"]: c for c in read_outputs(output, "closes")}
    # Nothing acknowledged before the restart is lost: the join still open then is closed by
    # the drain with the messages it had.
    assert {j: c["reason"] for j, c in closes.items()} == {
        "before": "complete", "open-across": "timeout", "after": "complete"}
    assert closes["open-across"]["counts"]["messages"] == 2
    assert "Traceback" not in run.stderr()


def test_an_output_topic_deleted_under_a_running_job_loses_nothing(
    pubsub_emulator: PubSubEmulator, tmp_path: Path
) -> None:
    """docs/spec.md §5: a topic is a copy of the output files. Its topic deleted while the job
    runs, a close that cannot be published is counted and logged, the files still hold it and
    a drain ends as usual (the job failed, exit 1, and lost every message it had read, from
    the files too)."""
    topic, subscription = pubsub_emulator.topic_and_subscription("in")
    closes_topic, closes_subscription = pubsub_emulator.topic_and_subscription("closes")
    output = tmp_path / "out"
    run = FaninRun(["--subscription", subscription, "--output", str(output), "--window-s", "1",
                    "--closes-topic", closes_topic], tmp_path / "run")
    try:
        for data in _join("published", ("a", "b")):
            pubsub_emulator.publish(topic, data)
        got = pubsub_emulator.collect(closes_subscription, lambda got: len(got) >= 1,
                                      DEADLINE_S)
        assert [m.attributes["join_id"] for m in got] == ["published"], run.stderr()
        pubsub_emulator.publisher.delete_topic(topic=closes_topic)
        for data in _join("unpublished", ("a", "b")) + _join("open", ("a",)):
            pubsub_emulator.publish(topic, data)
        assert run.until(lambda: "not published to" in run.stderr(), DEADLINE_S), run.stderr()
        run.signal(signal.SIGINT)
        assert run.wait(DEADLINE_S) == 0, run.stderr()
    finally:
        run.stop()
    closes = {c["join_id"]: c["reason"] for c in read_outputs(output, "closes")}
    assert closes == {"published": "complete", "unpublished": "complete", "open": "timeout"}
    assert "Traceback" not in run.stderr()
    # reported at the first failure, then (within the minute) once more as the run ends
    reports = [line for line in run.stderr().splitlines() if "not published to" in line]
    assert [line.split(" fanin: ")[1].split(" (")[0] for line in reports] == [
        f"1 output(s) not published to {closes_topic}",
        f"2 output(s) not published to {closes_topic}"], reports


def test_an_outage_whose_cause_changes_is_logged_again(caplog: Any) -> None:
    """The emulator restarted without the subscription: the run logged only the first cause
    (the service unavailable) while every later pull failed for another (the subscription
    gone), which showed only in the recovery line, if any. A failing client stands in for
    the service (the fault injected)."""
    from google.api_core.exceptions import NotFound, ServiceUnavailable

    from fanin.io.pubsub_drain import Drain, _IdlePollingClient

    errors = [ServiceUnavailable("down"), ServiceUnavailable("down"), NotFound("gone"),
              NotFound("gone")]

    class Failing:
        def pull(self, **_: Any) -> Any:
            raise errors.pop(0)

    drain = Drain()
    drain.request()  # its waits between retries return at once
    client = _IdlePollingClient(Failing(), drain)
    with caplog.at_level("WARNING", logger="fanin"):
        for _ in range(4):
            client.pull("projects/p/subscriptions/s", 10, 1.0)
    said = [r.getMessage() for r in caplog.records if "pulling" in r.getMessage()]
    assert len(said) == 2, said
    assert "s failed (ServiceUnavailable: 503 down)" in said[0]
    assert "s now fails (NotFound: 404 gone)" in said[1]
