"""The in-memory Pub/Sub server with the real google-cloud-pubsub clients (``fanin publish``
is tested against the emulator in tests/fleet/test_publish_cli.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from support.pubsub_server import PubSubServer, pubsub_server_fixture

TOPIC = "projects/fanin-test/topics/receipts"
SUB = "projects/fanin-test/subscriptions/receipts"


class FakeClock:
    """Seconds since the epoch, moved only by the test."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def pubsub(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> Iterator[PubSubServer]:
    yield from pubsub_server_fixture(monkeypatch, clock=clock)


@pytest.fixture
def subscriber(pubsub: PubSubServer) -> Iterator[pubsub_v1.SubscriberClient]:
    with pubsub_v1.SubscriberClient() as client:
        yield client


def _pull(client: pubsub_v1.SubscriberClient, max_messages: int = 10):
    return client.pull(subscription=SUB, max_messages=max_messages, timeout=10).received_messages


def test_real_clients_publish_pull_and_ack(
    pubsub: PubSubServer, subscriber: pubsub_v1.SubscriberClient
) -> None:
    publisher = pubsub_v1.PublisherClient()
    publisher.create_topic(name=TOPIC)
    subscriber.create_subscription(name=SUB, topic=TOPIC)
    assert publisher.get_topic(topic=TOPIC).name == TOPIC
    assert subscriber.get_subscription(subscription=SUB).topic == TOPIC

    futures = [publisher.publish(TOPIC, f"m{i}".encode(), n=str(i)) for i in range(3)]
    ids = [f.result(timeout=10) for f in futures]
    assert len(set(ids)) == 3

    received = _pull(subscriber)
    assert [r.message.data for r in received] == [b"m0", b"m1", b"m2"]
    assert [r.message.message_id for r in received] == ids
    assert [dict(r.message.attributes) for r in received] == [{"n": str(i)} for i in range(3)]
    assert all(r.message.publish_time is not None for r in received)
    subscriber.acknowledge(subscription=SUB, ack_ids=[r.ack_id for r in received])
    assert pubsub.unacked(SUB) == 0
    assert _pull(subscriber) == []  # empty answer after the server's short wait
    assert [m.data for m in pubsub.published(TOPIC)] == [b"m0", b"m1", b"m2"]

    subscriber.delete_subscription(subscription=SUB)
    publisher.delete_topic(topic=TOPIC)
    with pytest.raises(exceptions.NotFound):
        publisher.get_topic(topic=TOPIC)
    with pytest.raises(exceptions.NotFound):
        subscriber.pull(subscription=SUB, max_messages=1, timeout=10)


def test_errors_match_the_service(
    pubsub: PubSubServer, subscriber: pubsub_v1.SubscriberClient
) -> None:
    pubsub.create_topic(TOPIC)
    with pytest.raises(exceptions.AlreadyExists):
        pubsub_v1.PublisherClient().create_topic(name=TOPIC)
    with pytest.raises(exceptions.NotFound):
        subscriber.create_subscription(name=SUB, topic="projects/fanin-test/topics/missing")
    with pytest.raises(ValueError, match="INVALID_ARGUMENT"):
        pubsub.create_topic("topics/no-project")
    future = pubsub_v1.PublisherClient().publish("projects/fanin-test/topics/missing", b"x")
    with pytest.raises(exceptions.NotFound):
        future.result(timeout=10)


def test_unacked_message_is_redelivered_after_its_deadline(
    pubsub: PubSubServer, subscriber: pubsub_v1.SubscriberClient, clock: FakeClock
) -> None:
    pubsub.create_topic(TOPIC)
    pubsub.create_subscription(SUB, TOPIC, ack_deadline_s=10)
    message_id = pubsub.publish(TOPIC, b"once", {"a": "b"})

    (first,) = _pull(subscriber)
    clock.now += 9.999
    assert _pull(subscriber) == []  # still leased
    clock.now += 0.001
    (again,) = _pull(subscriber)
    assert again.message.message_id == message_id
    assert again.ack_id != first.ack_id
    subscriber.acknowledge(subscription=SUB, ack_ids=[first.ack_id])  # expired: ignored
    assert pubsub.unacked(SUB) == 1

    subscriber.modify_ack_deadline(
        subscription=SUB, ack_ids=[again.ack_id], ack_deadline_seconds=60
    )
    clock.now += 30
    assert _pull(subscriber) == []  # extended lease holds
    subscriber.modify_ack_deadline(subscription=SUB, ack_ids=[again.ack_id], ack_deadline_seconds=0)
    (nacked,) = _pull(subscriber)  # a zero deadline redelivers at once
    subscriber.acknowledge(subscription=SUB, ack_ids=[nacked.ack_id])
    clock.now += 3600
    assert _pull(subscriber) == []
    assert pubsub.unacked(SUB) == 0


def test_streaming_pull_subscribe_receives_and_acks(
    pubsub: PubSubServer, subscriber: pubsub_v1.SubscriberClient
) -> None:
    pubsub.create_topic(TOPIC)
    pubsub.create_subscription(SUB, TOPIC)
    got: list[bytes] = []
    lock = threading.Lock()

    def callback(message) -> None:
        with lock:
            got.append(message.data)
        message.ack()

    stream = subscriber.subscribe(SUB, callback)
    try:
        for i in range(5):
            pubsub.publish(TOPIC, f"s{i}".encode())
        assert pubsub.wait_for(lambda: pubsub.unacked(SUB) == 0 and len(got) == 5, 30)
    finally:
        stream.cancel()
        stream.result(timeout=30)
    assert sorted(got) == [f"s{i}".encode() for i in range(5)]
