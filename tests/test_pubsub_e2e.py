"""End to end over a real gRPC socket: opens and receipts published to Pub/Sub, the pipeline
reads them with ReadFromPubSub on the local runner, and closes come back on a closes topic."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from support.pubsub_server import PubSubServer, pubsub_server_fixture

from fanin.contracts.catalog import Catalog, load_contracts
from fanin.contracts.timefmt import format_ms
from fanin.fleet.simulate import CONTRACTS_PATH
from fanin.pipelines.pipeline import RunConfig, build

TOPIC_IN = "projects/fanin-test/topics/receipts"
SUB_IN = "projects/fanin-test/subscriptions/fanin"
CLOSES = "projects/fanin-test/topics/closes"
DEAD = "projects/fanin-test/topics/dead"
LATE = "projects/fanin-test/topics/late"


@pytest.fixture
def pubsub(monkeypatch: pytest.MonkeyPatch) -> Iterator[PubSubServer]:
    yield from pubsub_server_fixture(monkeypatch)


def test_receipts_in_closes_out_over_pubsub(pubsub: PubSubServer, tmp_path: Path) -> None:
    for topic in (TOPIC_IN, CLOSES, DEAD, LATE):
        pubsub.create_topic(topic)
    pubsub.create_subscription(SUB_IN, TOPIC_IN)
    now = int(time.time() * 1000)
    messages = []
    for j in range(3):
        join_id = f"pj-{j}"
        messages.append({"kind": "open", "join_id": join_id, "opened_at": format_ms(now),
                         "contract": "triage", "run_id": "e2e"})
        for i, branch in enumerate(("retrieve", "verify", "rank")):
            messages.append({"join_id": join_id, "branch": branch, "status": "ok",
                             "event_time": format_ms(now + 1 + i),
                             "key": "score" if branch == "rank" else branch,
                             "value": 0.5 if branch == "rank" else f"{branch}-{j}"})
    # a receipt that arrives before its open, a redelivery after the (eager) close, and a
    # malformed message
    messages.insert(0, messages.pop(1))
    messages.append(messages[-1])
    for message in messages:
        pubsub.publish(TOPIC_IN, json.dumps(message).encode(),
                       {"event_time": message.get("event_time") or message["opened_at"]})
    pubsub.publish(TOPIC_IN, b"{not json", {"event_time": format_ms(now)})

    config = RunConfig(output=str(tmp_path / "out"), subscription=SUB_IN,
                       contracts_path=CONTRACTS_PATH,
                       topics={"closes": CLOSES, "dead_letter": DEAD, "late": LATE})
    config.validate()
    p = beam.Pipeline(options=PipelineOptions(["--runner=BundleBasedDirectRunner",
                                               "--streaming"]))
    build(p, config, Catalog(load_contracts(CONTRACTS_PATH)))
    result = p.run()
    try:
        done = pubsub.wait_for(lambda: len(pubsub.published(CLOSES)) >= 3
                               and len(pubsub.published(DEAD)) >= 1
                               and len(pubsub.published(LATE)) >= 1, 60.0)
    finally:
        result.cancel()
    assert done, "closes did not come back on the closes topic"
    closes = [json.loads(m.data) for m in pubsub.published(CLOSES)]
    assert sorted(c["join_id"] for c in closes) == ["pj-0", "pj-1", "pj-2"]
    assert all(c["reason"] == "complete" and c["run_id"] == "e2e" for c in closes)
    assert {m.attributes["join_id"] for m in pubsub.published(CLOSES)} == {"pj-0", "pj-1", "pj-2"}
    assert sum(c["counts"]["messages"] for c in closes) == 12
    late = [json.loads(m.data) for m in pubsub.published(LATE)]
    assert [(x["join_id"], x["reason"]) for x in late] == [("pj-2", "after_close")]
    dead = [json.loads(m.data) for m in pubsub.published(DEAD)]
    assert dead[0]["error"] == "invalid_json"
    assert dead[0]["source"]["kind"] == "pubsub" and dead[0]["source"]["message_id"]
