"""An in-memory Google Cloud Pub/Sub server over real gRPC, for tests.

``PubSubServer`` listens on ``127.0.0.1`` (a free port chosen by the OS) and speaks the
``google.pubsub.v1`` Publisher and Subscriber services, so the real ``google-cloud-pubsub``
clients and Beam's ``ReadFromPubSub`` / ``WriteToPubSub`` talk to it unchanged once
``PUBSUB_EMULATOR_HOST`` is set to ``server.host``. The installed ``google.pubsub_v1`` package
ships no ``*_pb2_grpc`` servicers, so the RPCs are registered as generic handlers that use the
proto-plus message classes' ``serialize`` / ``deserialize``.

Implemented RPCs: Publisher ``CreateTopic``, ``GetTopic``, ``Publish``, ``DeleteTopic``;
Subscriber ``CreateSubscription``, ``GetSubscription``, ``DeleteSubscription``, ``Pull``,
``Acknowledge``, ``ModifyAckDeadline``, ``StreamingPull``. Any other RPC answers
``UNIMPLEMENTED``.

Guarantees (what tests may rely on):

- Every published message gets a server-assigned ``message_id`` (a decimal counter, unique per
  server) and ``publish_time`` (from the server's clock); data, attributes and ordering key are
  kept as sent.
- A message published to a topic is delivered to every subscription that existed on that topic
  when it was published, in publish order per subscription (redeliveries go to the front).
- A delivered message is outstanding until acknowledged; when its ack deadline passes (on the
  injectable ``clock``) it is redelivered with a new ``ack_id``. ``ModifyAckDeadline`` with 0
  seconds redelivers at once (nack). Acks for unknown or expired ack ids are ignored, as Pub/Sub
  does. Deadlines are checked lazily, whenever a Pull, StreamingPull, Acknowledge or
  ModifyAckDeadline touches the subscription.
- ``Pull`` waits at most ``pull_wait_s`` real seconds for messages (none if
  ``return_immediately``) and then answers, possibly with no messages, so a pulling client never
  blocks for long and never busy-loops.
- Missing resources answer ``NOT_FOUND``, duplicates ``ALREADY_EXISTS``, malformed requests
  ``INVALID_ARGUMENT``, like the real service. Ordering keys, filters, dead-letter policies,
  retention and exactly-once delivery are not modelled.
"""

from __future__ import annotations

import datetime
import itertools
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import grpc
from google.protobuf import empty_pb2
from google.pubsub_v1.types import pubsub

__all__ = ["EnvSetter", "PubSubServer", "pubsub_server_fixture"]

_TOPIC_PATH = re.compile(r"projects/[^/]+/topics/[^/]+\Z")
_SUBSCRIPTION_PATH = re.compile(r"projects/[^/]+/subscriptions/[^/]+\Z")
_DELETED_TOPIC = "_deleted-topic_"
_MAX_ACK_DEADLINE_S = 600
_STREAM_BATCH = 100
_T = TypeVar("_T")


@dataclass
class _Subscription:
    name: str
    topic: str
    ack_deadline_s: int
    backlog: deque[pubsub.PubsubMessage] = field(default_factory=deque)
    # ack_id -> (message, deadline on the server clock)
    outstanding: dict[str, tuple[pubsub.PubsubMessage, float]] = field(default_factory=dict)


@dataclass
class _Topic:
    name: str
    history: list[pubsub.PubsubMessage] = field(default_factory=list)
    subscriptions: set[str] = field(default_factory=set)


class _Abort(Exception):
    """A request error, turned into a gRPC status by the handler wrapper."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class PubSubServer:
    """In-memory Pub/Sub over gRPC on ``127.0.0.1``; a context manager (start on enter).

    ``clock`` returns seconds since the epoch; it stamps ``publish_time`` and drives ack
    deadlines, so a test can pass a controllable clock to force redelivery without sleeping.
    The helpers (``create_topic``, ``publish``...) act on the same state as the RPCs and take
    full resource paths (``projects/P/topics/T``, ``projects/P/subscriptions/S``).
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        pull_wait_s: float = 0.2,
        max_workers: int = 16,
    ) -> None:
        self._clock = clock
        self._pull_wait_s = pull_wait_s
        self._max_workers = max_workers
        # Re-entrant so that wait_for predicates may call the helpers below.
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._topics: dict[str, _Topic] = {}
        self._subscriptions: dict[str, _Subscription] = {}
        self._message_ids = itertools.count(1)
        self._ack_ids = itertools.count(1)
        self._server: grpc.Server | None = None
        self._port: int | None = None
        self._stopping = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> PubSubServer:
        """Bind a free port on 127.0.0.1 and start serving; returns ``self``."""
        if self._server is not None:
            raise RuntimeError("PubSubServer is already started")
        self._stopping.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._max_workers))
        server.add_generic_rpc_handlers(self._handlers())
        self._port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving; open streams are cancelled. Idempotent. State is kept."""
        if self._server is None:
            return
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        self._server.stop(grace=None).wait()
        self._server = None

    def __enter__(self) -> PubSubServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``, the value for ``PUBSUB_EMULATOR_HOST``."""
        if self._port is None:
            raise RuntimeError("PubSubServer is not started")
        return f"127.0.0.1:{self._port}"

    # -- helpers for tests -----------------------------------------------------------------

    def create_topic(self, name: str) -> None:
        """Create topic ``name``; ``ValueError`` if malformed or it exists."""
        self._call(self._create_topic, name)

    def create_subscription(self, sub: str, topic: str, ack_deadline_s: int = 10) -> None:
        """Create subscription ``sub`` on existing ``topic``; ``ValueError`` on any refusal."""
        self._call(self._create_subscription, sub, topic, ack_deadline_s)

    def publish(self, topic: str, data: bytes, attributes: Mapping[str, str] | None = None) -> str:
        """Publish one message as the Publish RPC would; returns its message id."""
        message = pubsub.PubsubMessage(data=data, attributes=dict(attributes or {}))
        return self._call(self._publish, topic, [message])[0]

    def published(self, topic: str) -> list[pubsub.PubsubMessage]:
        """Every message published to ``topic`` so far, in publish order, as stored."""
        with self._lock:
            if topic not in self._topics:
                raise ValueError(f"topic not found: {topic}")
            return list(self._topics[topic].history)

    def subscriptions(self) -> list[str]:
        """Names of the existing subscriptions (e.g. ones a reader created), sorted."""
        with self._lock:
            return sorted(self._subscriptions)

    def unacked(self, sub: str) -> int:
        """How many messages of ``sub`` are not yet acknowledged (waiting or outstanding)."""
        with self._lock:
            state = self._call(self._subscription_locked, sub)
            return len(state.backlog) + len(state.outstanding)

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds or ``timeout_s`` real seconds passed; its last value.

        ``predicate`` is re-evaluated whenever the server's state changes (publish, ack,
        create...), at least every 0.1 s, and may call this server's helpers.
        """
        end = time.monotonic() + timeout_s
        with self._changed:
            while not (result := predicate()):
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return result
                self._changed.wait(min(remaining, 0.1))
            return result

    @staticmethod
    def _call(fn: Callable[..., _T], *args: object) -> _T:
        try:
            return fn(*args)
        except _Abort as exc:
            raise ValueError(f"{exc.code.name}: {exc}") from None

    # -- state operations (raise _Abort) ---------------------------------------------------

    def _create_topic(self, name: str) -> pubsub.Topic:
        if not _TOPIC_PATH.match(name):
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid topic name: {name!r}")
        with self._changed:
            if name in self._topics:
                raise _Abort(grpc.StatusCode.ALREADY_EXISTS, f"Topic already exists: {name}")
            self._topics[name] = _Topic(name)
            self._changed.notify_all()
        return pubsub.Topic(name=name)

    def _get_topic(self, name: str) -> pubsub.Topic:
        with self._lock:
            self._topic_locked(name)
        return pubsub.Topic(name=name)

    def _delete_topic(self, name: str) -> None:
        with self._changed:
            topic = self._topic_locked(name)
            for sub_name in topic.subscriptions:
                self._subscriptions[sub_name].topic = _DELETED_TOPIC
            del self._topics[name]
            self._changed.notify_all()

    def _create_subscription(
        self, name: str, topic: str, ack_deadline_s: int
    ) -> pubsub.Subscription:
        if not _SUBSCRIPTION_PATH.match(name):
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"Invalid subscription name: {name!r}")
        ack_deadline_s = ack_deadline_s or 10
        if not 10 <= ack_deadline_s <= _MAX_ACK_DEADLINE_S:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "ack_deadline_seconds must be 10-600")
        with self._changed:
            topic_state = self._topic_locked(topic)
            if name in self._subscriptions:
                raise _Abort(grpc.StatusCode.ALREADY_EXISTS, f"Subscription already exists: {name}")
            self._subscriptions[name] = _Subscription(name, topic, ack_deadline_s)
            topic_state.subscriptions.add(name)
            self._changed.notify_all()
        return self._subscription_proto(name, topic, ack_deadline_s)

    def _get_subscription(self, name: str) -> pubsub.Subscription:
        with self._lock:
            sub = self._subscription_locked(name)
            return self._subscription_proto(sub.name, sub.topic, sub.ack_deadline_s)

    def _delete_subscription(self, name: str) -> None:
        with self._changed:
            sub = self._subscription_locked(name)
            del self._subscriptions[name]
            if sub.topic in self._topics:
                self._topics[sub.topic].subscriptions.discard(name)
            self._changed.notify_all()

    def _publish(self, topic: str, messages: Iterable[pubsub.PubsubMessage]) -> list[str]:
        with self._changed:
            topic_state = self._topic_locked(topic)
            stored = []
            for message in messages:
                if not message.data and not message.attributes:
                    raise _Abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "Some messages contain neither data nor attributes",
                    )
                stored.append(
                    pubsub.PubsubMessage(
                        data=message.data,
                        attributes=dict(message.attributes),
                        ordering_key=message.ordering_key,
                        message_id=str(next(self._message_ids)),
                        publish_time=datetime.datetime.fromtimestamp(
                            self._clock(), tz=datetime.timezone.utc
                        ),
                    )
                )
            topic_state.history.extend(stored)
            for sub_name in topic_state.subscriptions:
                self._subscriptions[sub_name].backlog.extend(stored)
            self._changed.notify_all()
            return [m.message_id for m in stored]

    def _take(
        self, name: str, max_messages: int, wait_s: float, ack_deadline_s: int | None = None
    ) -> list[pubsub.ReceivedMessage]:
        """Deliver up to ``max_messages`` from ``name``, waiting at most ``wait_s`` for one."""
        end = time.monotonic() + wait_s
        with self._changed:
            while True:
                sub = self._subscription_locked(name)
                self._expire_locked(sub)
                remaining = end - time.monotonic()
                if sub.backlog or remaining <= 0 or self._stopping.is_set():
                    break
                self._changed.wait(remaining)
            deadline = self._clock() + (ack_deadline_s or sub.ack_deadline_s)
            received = []
            while sub.backlog and len(received) < max_messages:
                message = sub.backlog.popleft()
                ack_id = f"{next(self._ack_ids)}"
                sub.outstanding[ack_id] = (message, deadline)
                received.append(pubsub.ReceivedMessage(ack_id=ack_id, message=message))
            return received

    def _acknowledge(self, name: str, ack_ids: Iterable[str]) -> None:
        with self._changed:
            sub = self._subscription_locked(name)
            self._expire_locked(sub)
            for ack_id in ack_ids:
                sub.outstanding.pop(ack_id, None)
            self._changed.notify_all()

    def _modify_ack_deadline(self, name: str, ack_ids: Iterable[str], seconds: int) -> None:
        if not 0 <= seconds <= _MAX_ACK_DEADLINE_S:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "ack_deadline_seconds must be 0-600")
        with self._changed:
            sub = self._subscription_locked(name)
            self._expire_locked(sub)
            deadline = self._clock() + seconds
            for ack_id in ack_ids:
                if ack_id in sub.outstanding:
                    sub.outstanding[ack_id] = (sub.outstanding[ack_id][0], deadline)
            self._expire_locked(sub)
            self._changed.notify_all()

    def _expire_locked(self, sub: _Subscription) -> None:
        """Move outstanding messages whose deadline passed back to the front of the backlog."""
        now = self._clock()
        expired = [ack_id for ack_id, (_, dl) in sub.outstanding.items() if dl <= now]
        for ack_id in reversed(expired):
            sub.backlog.appendleft(sub.outstanding.pop(ack_id)[0])

    def _topic_locked(self, name: str) -> _Topic:
        topic = self._topics.get(name)
        if topic is None:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"Resource not found (resource={name}).")
        return topic

    def _subscription_locked(self, name: str) -> _Subscription:
        sub = self._subscriptions.get(name)
        if sub is None:
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"Resource not found (resource={name}).")
        return sub

    @staticmethod
    def _subscription_proto(name: str, topic: str, ack_deadline_s: int) -> pubsub.Subscription:
        return pubsub.Subscription(name=name, topic=topic, ack_deadline_seconds=ack_deadline_s)

    # -- gRPC surface ----------------------------------------------------------------------

    def _handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        def unary(fn: Callable, request_type: type, response_type: type | None):
            def handler(request, context: grpc.ServicerContext):
                try:
                    response = fn(request)
                except _Abort as exc:
                    context.abort(exc.code, str(exc))
                return empty_pb2.Empty() if response_type is None else response

            serializer = (
                empty_pb2.Empty.SerializeToString
                if response_type is None
                else response_type.serialize
            )
            return grpc.unary_unary_rpc_method_handler(
                handler,
                request_deserializer=request_type.deserialize,
                response_serializer=serializer,
            )

        publisher = {
            "CreateTopic": unary(lambda r: self._create_topic(r.name), pubsub.Topic, pubsub.Topic),
            "GetTopic": unary(
                lambda r: self._get_topic(r.topic), pubsub.GetTopicRequest, pubsub.Topic
            ),
            "DeleteTopic": unary(
                lambda r: self._delete_topic(r.topic), pubsub.DeleteTopicRequest, None
            ),
            "Publish": unary(
                lambda r: pubsub.PublishResponse(message_ids=self._publish(r.topic, r.messages)),
                pubsub.PublishRequest,
                pubsub.PublishResponse,
            ),
        }
        subscriber = {
            "CreateSubscription": unary(
                lambda r: self._create_subscription(r.name, r.topic, r.ack_deadline_seconds),
                pubsub.Subscription,
                pubsub.Subscription,
            ),
            "GetSubscription": unary(
                lambda r: self._get_subscription(r.subscription),
                pubsub.GetSubscriptionRequest,
                pubsub.Subscription,
            ),
            "DeleteSubscription": unary(
                lambda r: self._delete_subscription(r.subscription),
                pubsub.DeleteSubscriptionRequest,
                None,
            ),
            "Pull": unary(self._pull_rpc, pubsub.PullRequest, pubsub.PullResponse),
            "Acknowledge": unary(
                lambda r: self._acknowledge(r.subscription, r.ack_ids),
                pubsub.AcknowledgeRequest,
                None,
            ),
            "ModifyAckDeadline": unary(
                lambda r: self._modify_ack_deadline(
                    r.subscription, r.ack_ids, r.ack_deadline_seconds
                ),
                pubsub.ModifyAckDeadlineRequest,
                None,
            ),
            "StreamingPull": grpc.stream_stream_rpc_method_handler(
                self._streaming_pull_rpc,
                request_deserializer=pubsub.StreamingPullRequest.deserialize,
                response_serializer=pubsub.StreamingPullResponse.serialize,
            ),
        }
        return (
            grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", publisher),
            grpc.method_handlers_generic_handler("google.pubsub.v1.Subscriber", subscriber),
        )

    def _pull_rpc(self, request: pubsub.PullRequest) -> pubsub.PullResponse:
        if request.max_messages <= 0:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, "max_messages must be > 0")
        wait_s = 0.0 if request.return_immediately else self._pull_wait_s
        return pubsub.PullResponse(
            received_messages=self._take(request.subscription, request.max_messages, wait_s)
        )

    def _streaming_pull_rpc(
        self,
        requests: Iterator[pubsub.StreamingPullRequest],
        context: grpc.ServicerContext,
    ) -> Iterator[pubsub.StreamingPullResponse]:
        """Deliver messages on the stream while a thread applies the client's acks/modacks."""
        first = next(requests, None)
        if first is None:
            return
        name = first.subscription
        stream_deadline_s = first.stream_ack_deadline_seconds or None
        closed = threading.Event()
        context.add_callback(closed.set)

        def apply(request: pubsub.StreamingPullRequest) -> None:
            if request.ack_ids:
                self._acknowledge(name, request.ack_ids)
            for ack_id, seconds in zip(
                request.modify_deadline_ack_ids, request.modify_deadline_seconds, strict=False
            ):
                self._modify_ack_deadline(name, [ack_id], seconds)

        def consume() -> None:
            try:
                for request in requests:
                    apply(request)
            except (_Abort, grpc.RpcError):
                pass
            finally:
                closed.set()
                with self._changed:
                    self._changed.notify_all()

        try:
            with self._lock:
                self._subscription_locked(name)
            apply(first)
        except _Abort as exc:
            context.abort(exc.code, str(exc))
        threading.Thread(target=consume, name="pubsub-stream-requests", daemon=True).start()
        while not closed.is_set() and not self._stopping.is_set():
            try:
                received = self._take(name, _STREAM_BATCH, self._pull_wait_s, stream_deadline_s)
            except _Abort as exc:
                context.abort(exc.code, str(exc))
            if received:
                yield pubsub.StreamingPullResponse(received_messages=received)


class EnvSetter(Protocol):
    """What ``pubsub_server_fixture`` needs from pytest's ``monkeypatch``."""

    def setenv(self, name: str, value: str) -> None: ...


def pubsub_server_fixture(
    monkeypatch: EnvSetter, *, clock: Callable[[], float] = time.time
) -> Iterator[PubSubServer]:
    """Generator for a pytest fixture: a started server with ``PUBSUB_EMULATOR_HOST`` set.

    Wrap it in a test module::

        @pytest.fixture
        def pubsub(monkeypatch):
            yield from pubsub_server_fixture(monkeypatch)

    The server is stopped when the generator is closed (fixture teardown); ``monkeypatch``
    restores the environment variable.
    """
    with PubSubServer(clock=clock) as server:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.host)
        yield server
