"""ReadMessages and PublishJson in a streaming pipeline against the in-memory Pub/Sub server.

How the streaming pipeline is run and stopped on the local runner: ``p.run()`` with
``--runner=BundleBasedDirectRunner --streaming`` returns at once with a ``DirectPipelineResult``
while the pipeline keeps pulling in a background thread. ``wait_until_finish(duration=...)``
raises ``NotImplementedError`` on that runner and plain ``wait_until_finish()`` never returns
for an unbounded source, so the test polls the fake server for the pipeline's output with a
bounded loop and a deadline, then calls ``result.cancel()``, which shuts the executor down and
waits for its worker thread (at most one in-flight Pull, ``pull_wait_s`` long). Cancelling is in
a ``finally`` so a failing assertion never leaves a pipeline running.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Iterator

import apache_beam as beam
import pytest
from apache_beam.io.gcp.pubsub import ReadFromPubSub
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import PipelineVisitor
from support.pubsub_server import PubSubServer, pubsub_server_fixture

from fanin.io.pubsub import PublishJson, ReadMessages

TOPIC_IN = "projects/fanin-test/topics/in"
SUB_IN = "projects/fanin-test/subscriptions/in"
TOPIC_OUT = "projects/fanin-test/topics/out"
DEADLINE_S = 30.0


@pytest.fixture
def pubsub(monkeypatch: pytest.MonkeyPatch) -> Iterator[PubSubServer]:
    yield from pubsub_server_fixture(monkeypatch)


def _streaming_pipeline() -> beam.Pipeline:
    return beam.Pipeline(
        options=PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    )


def _run_until(p: beam.Pipeline, server: PubSubServer, done: Callable[[], bool]) -> None:
    """Run ``p`` until ``done()`` holds (re-checked on every server change), then cancel it."""
    result = p.run()
    try:
        assert server.wait_for(done, DEADLINE_S), "pipeline output incomplete at the deadline"
    finally:
        result.cancel()


class _Describe(beam.DoFn):
    """(data, source) -> a dict showing the element's join_id, source and timestamp."""

    def process(self, element: tuple[bytes, dict], timestamp=beam.DoFn.TimestampParam):
        data, source = element
        yield {
            "join_id": json.loads(data)["join_id"],
            "source": source,
            "timestamp_ms": timestamp.micros // 1000,
        }


def test_read_messages_to_publish_json_round_trip(pubsub: PubSubServer) -> None:
    pubsub.create_topic(TOPIC_IN)
    pubsub.create_subscription(SUB_IN, TOPIC_IN)
    pubsub.create_topic(TOPIC_OUT)
    sent = {
        "j-good": ({"event_time": "2026-01-02T03:04:05.678Z", "run_id": "r1"}, 1767323045678),
        "j-millis": ({"event_time": "1767323045000"}, 1767323045000),
        "j-bad": ({"event_time": "not a time"}, None),
        "j-none": ({}, None),
    }
    ids = {
        join_id: pubsub.publish(TOPIC_IN, json.dumps({"join_id": join_id}).encode(), attrs)
        for join_id, (attrs, _) in sent.items()
    }
    publish_ms = {
        m.message_id: int(m.publish_time.timestamp() * 1000) for m in pubsub.published(TOPIC_IN)
    }

    p = _streaming_pipeline()
    _ = (
        p
        | ReadMessages(subscription=SUB_IN)
        | beam.ParDo(_Describe())
        | PublishJson(TOPIC_OUT, attributes_fn=lambda obj: {"origin": "test"})
    )
    _run_until(p, pubsub, lambda: len(pubsub.published(TOPIC_OUT)) >= len(sent))

    out = pubsub.published(TOPIC_OUT)
    assert len(out) == len(sent)
    by_join = {}
    for message in out:
        assert message.data == json.dumps(json.loads(message.data), separators=(",", ":")).encode()
        obj = json.loads(message.data)
        assert dict(message.attributes) == {"join_id": obj["join_id"], "origin": "test"}
        by_join[obj["join_id"]] = obj
    assert set(by_join) == set(sent)
    for join_id, (attrs, event_ms) in sent.items():
        obj = by_join[join_id]
        source = obj["source"]
        assert source["kind"] == "pubsub"
        assert source["subscription"] == SUB_IN
        assert source["message_id"] == ids[join_id]
        assert source["attributes"] == attrs
        assert source["publish_time"].endswith("Z")
        # A missing or unparseable event_time falls back to the publish time (no crash).
        expected_ms = event_ms if event_ms is not None else publish_ms[ids[join_id]]
        assert obj["timestamp_ms"] == expected_ms
    # The input was acknowledged: nothing is left outstanding or waiting on the subscription.
    assert pubsub.unacked(SUB_IN) == 0


def _relay_pipeline(topic_in: str, topic_out: str) -> beam.Pipeline:
    """topic_in (read with topic=, publish-time stamps) -> {join_id, source} -> topic_out."""
    p = _streaming_pipeline()
    _ = (
        p
        | ReadMessages(topic=topic_in, timestamp_attribute=None)
        | beam.Map(lambda e: {"join_id": json.loads(e[0])["join_id"], "source": e[1]})
        | PublishJson(topic_out)
    )
    return p


def test_read_messages_from_topic_creates_a_subscription(pubsub: PubSubServer) -> None:
    pubsub.create_topic(TOPIC_IN)
    pubsub.create_topic(TOPIC_OUT)
    p = _relay_pipeline(TOPIC_IN, TOPIC_OUT)

    def relay() -> bool:
        # The runner's temporary subscription exists only once the pipeline started reading;
        # publish then, since a topic read sees only messages published after that.
        if pubsub.subscriptions() and not pubsub.published(TOPIC_IN):
            pubsub.publish(TOPIC_IN, b'{"join_id":"j1"}', {"k": "v"})
        return bool(pubsub.published(TOPIC_OUT))

    _run_until(p, pubsub, relay)
    # The runner deletes its temporary subscription when the read transform is collected;
    # force that while the server is up (else it retries for 60 s at interpreter exit).
    del p
    gc.collect()
    assert pubsub.wait_for(lambda: not pubsub.subscriptions(), DEADLINE_S)
    (message,) = pubsub.published(TOPIC_OUT)
    obj = json.loads(message.data)
    assert obj["join_id"] == "j1"
    assert obj["source"]["topic"] == TOPIC_IN
    assert "subscription" not in obj["source"]
    assert obj["source"]["attributes"] == {"k": "v"}


def test_read_messages_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        ReadMessages()
    with pytest.raises(ValueError, match="exactly one"):
        ReadMessages(subscription=SUB_IN, topic=TOPIC_IN)
    with pytest.raises(ValueError):
        ReadMessages(subscription="subscriptions/in")
    with pytest.raises(ValueError):
        PublishJson("topics/out")


def test_id_label_is_refused_off_dataflow() -> None:
    p = _streaming_pipeline()
    with pytest.raises(NotImplementedError, match="Dataflow"):
        _ = p | ReadMessages(subscription=SUB_IN, id_label="message_id")


def test_id_label_is_accepted_on_dataflow() -> None:
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    p = _streaming_pipeline()
    # Only the runner's type matters at construction time; building a real Dataflow pipeline
    # would validate GCP options and credentials, which is slow and needs the network.
    p.runner = DataflowRunner()
    _ = p | ReadMessages(subscription=SUB_IN, id_label="message_id")
    reads = []

    class FindReads(PipelineVisitor):
        def enter_composite_transform(self, node) -> None:
            self.visit_transform(node)

        def visit_transform(self, node) -> None:
            if isinstance(node.transform, ReadFromPubSub):
                reads.append(node.transform)

    p.visit(FindReads())
    (read,) = reads
    assert read._source.id_label == "message_id"  # handed to ReadFromPubSub unchanged
