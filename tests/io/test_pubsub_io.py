"""ReadMessages and PublishJson in a streaming pipeline against Google's Pub/Sub emulator.

How the streaming pipeline is run and stopped on the local runner: ``p.run()`` with
``--runner=BundleBasedDirectRunner --streaming`` returns at once with a ``DirectPipelineResult``
while the pipeline keeps pulling in a background thread. ``wait_until_finish(duration=...)``
raises ``NotImplementedError`` on that runner and plain ``wait_until_finish()`` never returns
for an unbounded source, so the test pulls the pipeline's output topic with a deadline, then
calls ``result.cancel()``, which shuts the executor down and waits for its worker thread.
Cancelling is in a ``finally`` so a failing assertion never leaves a pipeline running.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable

import apache_beam as beam
import pytest
from apache_beam.io.gcp.pubsub import ReadFromPubSub
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import PipelineVisitor
from support.emulator import PubSubEmulator, wait_for

from fanin.io import pubsub as pubsub_io
from fanin.io.pubsub import MAX_TOPIC_DATA, PublishJson, ReadMessages, parse_event_time_ms

TOPIC_IN = "projects/fanin-test/topics/inbox"
SUB_IN = "projects/fanin-test/subscriptions/inbox"
DEADLINE_S = 60.0


def _streaming_pipeline() -> beam.Pipeline:
    return beam.Pipeline(
        options=PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    )


def _run_until(p: beam.Pipeline, done: Callable[[], bool]) -> None:
    """Run ``p`` until ``done()`` holds (polled), then cancel it."""
    result = p.run()
    try:
        assert wait_for(done, DEADLINE_S, 0.1), "pipeline output incomplete at the deadline"
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


def test_read_messages_to_publish_json_round_trip(pubsub_emulator: PubSubEmulator) -> None:
    topic_in, sub_in = pubsub_emulator.topic_and_subscription("in")
    topic_out, sub_out = pubsub_emulator.topic_and_subscription("out")
    sent = {
        "j-good": ({"event_time": "2026-01-02T03:04:05.678Z", "run_id": "r1"}, 1767323045678),
        "j-millis": ({"event_time": "1767323045000"}, 1767323045000),
        "j-bad": ({"event_time": "not a time"}, None),
        "j-none": ({}, None),
    }
    ids = {
        join_id: pubsub_emulator.publish(topic_in, json.dumps({"join_id": join_id}).encode(),
                                         **attrs)
        for join_id, (attrs, _) in sent.items()
    }

    p = _streaming_pipeline()
    _ = (
        p
        | ReadMessages(subscription=sub_in)
        | beam.ParDo(_Describe())
        | PublishJson(topic_out, attributes_fn=lambda obj: {"origin": "test"})
    )
    out: list = []
    _run_until(p, lambda: out.extend(pubsub_emulator.pull(sub_out)) or len(out) >= len(sent))

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
        assert source["subscription"] == sub_in
        assert source["message_id"] == ids[join_id]
        assert source["attributes"] == attrs
        assert source["publish_time"].endswith("Z")
        # A missing or unparseable event_time falls back to the publish time (no crash).
        publish_ms = parse_event_time_ms(source["publish_time"])
        expected_ms = event_ms if event_ms is not None else publish_ms
        assert obj["timestamp_ms"] == expected_ms
    # The input was acknowledged: nothing is redelivered on the subscription.
    assert pubsub_emulator.pull(sub_in) == []


def test_messages_over_4_mib_are_read_and_outputs_over_10_mb_publish_a_marker(
    pubsub_emulator: PubSubEmulator,
) -> None:
    """A 5 MB input message (Pub/Sub takes up to 10 MB) is read: the emulator client's gRPC
    channel refused answers over 4 MiB and the read retried the same pull for ever. An output
    over Pub/Sub's limit is published as a marker instead of failing the run."""
    topic_in, sub_in = pubsub_emulator.topic_and_subscription("in")
    topic_out, sub_out = pubsub_emulator.topic_and_subscription("out")
    for join_id, pad in (("j-small", 10), ("j-big", 5_000_000)):
        pubsub_emulator.publish(topic_in, json.dumps({"join_id": join_id, "pad": "x" * pad})
                                .encode())
    p = _streaming_pipeline()
    _ = (
        p
        | ReadMessages(subscription=sub_in, timestamp_attribute=None)
        | beam.Map(lambda e: {"join_id": json.loads(e[0])["join_id"], "reason": "complete",
                              "blob": "y" * (2 * len(e[0]) + 100)})
        | PublishJson(topic_out)
    )
    out: list = []
    _run_until(p, lambda: out.extend(pubsub_emulator.pull(sub_out)) or len(out) >= 2)
    by_join = {json.loads(m.data)["join_id"]: json.loads(m.data) for m in out}
    assert len(out) == 2 and by_join["j-small"]["blob"].startswith("y")
    size = by_join["j-big"]["too_large_for_pubsub"]
    assert size > MAX_TOPIC_DATA and by_join["j-big"] == {
        "join_id": "j-big", "reason": "complete", "too_large_for_pubsub": size}
    assert pubsub_emulator.pull(sub_in) == []  # both read and acknowledged


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


def test_read_messages_from_topic_creates_a_subscription(
    pubsub_emulator: PubSubEmulator,
) -> None:
    topic_in = pubsub_emulator.topic("in")
    topic_out, sub_out = pubsub_emulator.topic_and_subscription("out")
    p = _relay_pipeline(topic_in, topic_out)
    publisher = pubsub_emulator.publisher

    def subscriptions() -> list[str]:
        return list(publisher.list_topic_subscriptions(topic=topic_in))

    out: list = []

    def relay() -> bool:
        # The runner's temporary subscription exists only once the pipeline started reading;
        # publish then, since a topic read sees only messages published after that.
        if not out and subscriptions():
            pubsub_emulator.publish(topic_in, b'{"join_id":"j1"}', k="v")
            out.append(None)
        out.extend(pubsub_emulator.pull(sub_out))
        return len(out) > 1

    _run_until(p, relay)
    # The runner deletes its temporary subscription when the read transform is collected;
    # force that while the emulator is up (else it retries for 60 s at interpreter exit).
    del p
    gc.collect()
    assert wait_for(lambda: not subscriptions(), DEADLINE_S)
    (message,) = out[1:]
    obj = json.loads(message.data)
    assert obj["join_id"] == "j1"
    assert obj["source"]["topic"] == topic_in
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


def test_dead_letters_on_a_topic_carry_their_messages_join_id() -> None:
    """docs/spec.md §5 Topics: every output message has attribute join_id; a dead letter's is
    its message's when that is a JSON object with a join_id string (it had none)."""
    attrs = pubsub_io._default_attributes
    assert attrs({"join_id": "j", "reason": "complete"}) == {"join_id": "j"}
    assert attrs({"error": "undefined_join", "detail": "d",
                  "raw": '{"join_id": "orphan", "branch": "a"}'}) == {"join_id": "orphan"}
    for raw in ("not json", '["j"]', '{"join_id": 7}', '{"join_id": ""}'):
        assert attrs({"error": "invalid_json", "detail": "d", "raw": raw}) == {}
    # a too_large dead letter's message is over every read limit: its join_id still counts
    big = json.dumps({"join_id": "tl", "branch": "a", "value": "x" * (6 << 20)})
    assert attrs({"error": "too_large", "detail": "d", "raw": big}) == {"join_id": "tl"}


@pytest.mark.parametrize("value", ["\u0661\u0667" + "\u0660" * 11, "\uff11\uff17\uff10\uff10",
                                   "17\uff100", "1700\n"])
def test_an_event_time_attribute_of_other_digits_is_unparseable(value: str) -> None:
    """Epoch milliseconds are ASCII digits, as RFC 3339's are (``int()`` reads others)."""
    assert parse_event_time_ms(value) is None
    assert parse_event_time_ms("1700") == 1700 and parse_event_time_ms("-1700") == -1700
