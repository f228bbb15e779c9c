"""Where emitted messages go: a JSONL file, Google Cloud Pub/Sub, or memory.

Guarantees:
- A sink receives ``EncodedMessage`` objects (one JSON line plus the attributes Pub/Sub needs)
  through ``publish``; ``flush`` blocks until everything published so far is durable or has
  failed, and raises ``PublishError`` listing every failed message; ``close`` flushes (and so
  raises the same way) and releases resources. Failures are never swallowed.
- ``JsonlFileSink`` appends whole lines (``\\n``-terminated, UTF-8) and is safe to share between
  threads of one process; ``flush`` also ``fsync``\\s. Use one file per process when several
  processes write.
- ``PubSubSink`` publishes the line as the message data with attributes ``event_time`` and
  ``message_id``; with ``ordering_by_join=True`` the ordering key is the ``join_id`` and message
  ordering is enabled in the client it creates. The client's own retry policy applies to each
  publish (``retry``/``timeout`` override it); a message that still fails is reported by the
  next ``flush``/``close``, and its ordering key is resumed so later messages of that join can be
  published again.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "EncodedMessage",
    "JsonlFileSink",
    "MemorySink",
    "PubSubSink",
    "PublishError",
    "Sink",
]


@dataclass(frozen=True)
class EncodedMessage:
    """One encoded message: the JSON line and the attributes a transport may need."""

    line: str
    join_id: str
    message_id: str
    event_time: str


class PublishError(RuntimeError):
    """Some messages could not be published; ``failures`` holds each with its exception."""

    def __init__(self, failures: Sequence[tuple[EncodedMessage, BaseException]]) -> None:
        self.failures = list(failures)
        shown = "; ".join(f"message_id={m.message_id} join_id={m.join_id}: "
                          f"{type(e).__name__}: {e}" for m, e in self.failures[:10])
        more = f"; ... and {len(self.failures) - 10} more" if len(self.failures) > 10 else ""
        super().__init__(f"{len(self.failures)} message(s) failed to publish: {shown}{more}")


_S = TypeVar("_S", bound="Sink")


class Sink(ABC):
    """What an ``Emitter`` writes to; ``with sink:`` closes it (surfacing failures) on exit."""

    @abstractmethod
    def publish(self, message: EncodedMessage) -> None:
        """Hand one message to the transport (may buffer)."""

    @abstractmethod
    def flush(self) -> None:
        """Block until every message so far is delivered; raise ``PublishError`` otherwise."""

    @abstractmethod
    def close(self) -> None:
        """Flush, then release resources; idempotent."""

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class MemorySink(Sink):
    """Keeps the lines in ``lines`` (for tests and notebooks)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def publish(self, message: EncodedMessage) -> None:
        with self._lock:
            self.lines.append(message.line)

    def flush(self) -> None:
        """Nothing is buffered: a no-op."""

    def close(self) -> None:
        """Nothing to release: a no-op."""


class JsonlFileSink(Sink):
    """Appends one line per message to ``path`` (created if absent)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8", newline="\n")

    def publish(self, message: EncodedMessage) -> None:
        with self._lock:
            if self._file.closed:
                raise ValueError(f"{self.path}: sink is closed")
            self._file.write(message.line + "\n")

    def flush(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()


class PubSubSink(Sink):
    """Publishes to a Pub/Sub ``topic`` (``projects/P/topics/T``) with batching.

    ``publisher`` injects a client (anything with ``publish(topic, data, ordering_key=...,
    **attributes) -> Future`` and ``resume_publish(topic, ordering_key)``); when omitted a
    ``google.cloud.pubsub_v1.PublisherClient`` is created with ``batch_settings`` (default: up to
    100 messages, 1 MB or 50 ms per batch), and stopped by ``close``.
    """

    def __init__(self, topic: str, ordering_by_join: bool = False, *, publisher: Any = None,
                 batch_settings: Any = None, retry: Any = None, timeout: float | None = None,
                 flush_timeout_s: float | None = 300.0) -> None:
        self.topic = topic
        self.ordering_by_join = ordering_by_join
        self._owned = publisher is None
        if publisher is None:
            from google.cloud import pubsub_v1

            publisher = pubsub_v1.PublisherClient(
                batch_settings=batch_settings or pubsub_v1.types.BatchSettings(
                    max_messages=100, max_bytes=1_000_000, max_latency=0.05),
                publisher_options=pubsub_v1.types.PublisherOptions(
                    enable_message_ordering=ordering_by_join),
            )
        self._publisher = publisher
        self._options: dict[str, Any] = {}
        if retry is not None:
            self._options["retry"] = retry
        if timeout is not None:
            self._options["timeout"] = timeout
        self._flush_timeout_s = flush_timeout_s
        self._lock = threading.Lock()
        self._pending: list[tuple[Future[Any], EncodedMessage]] = []
        self._closed = False

    def publish(self, message: EncodedMessage) -> None:
        if self._closed:
            raise ValueError(f"{self.topic}: sink is closed")
        future = self._publisher.publish(
            self.topic, message.line.encode("utf-8"),
            ordering_key=message.join_id if self.ordering_by_join else "",
            event_time=message.event_time, message_id=message.message_id, **self._options)
        with self._lock:
            self._pending.append((future, message))

    def flush(self) -> None:
        """Wait for every publish so far; raise ``PublishError`` listing those that failed."""
        with self._lock:
            pending, self._pending = self._pending, []
        failures: list[tuple[EncodedMessage, BaseException]] = []
        for future, message in pending:
            try:
                future.result(timeout=self._flush_timeout_s)
            except Exception as exc:  # every publish failure is reported, none swallowed
                failures.append((message, exc))
        if failures:
            if self.ordering_by_join:
                for join_id in dict.fromkeys(m.join_id for m, _ in failures):
                    self._publisher.resume_publish(self.topic, join_id)
            raise PublishError(failures)

    def close(self) -> None:
        """Flush, then stop the client this sink created; raises like ``flush``."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            if self._owned:
                self._publisher.stop()
