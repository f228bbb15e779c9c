"""Where emitted messages go: a JSONL file, Google Cloud Pub/Sub, or memory.

Guarantees:
- A sink receives ``EncodedMessage`` objects (one JSON line plus the attributes Pub/Sub needs)
  through ``publish``; ``flush`` blocks until everything published so far is durable or has
  failed, and raises ``PublishError`` listing every failed message; ``close`` flushes (and so
  raises the same way) and releases resources. Failures are never swallowed.
- ``JsonlFileSink`` appends whole lines (``\\n``-terminated, UTF-8) and is safe to share between
  threads of one process; ``flush`` also ``fsync``\\s. Use one file per process when several
  processes write. A failed ``write`` (a full disk) raises ``PublishError`` for its message,
  and a part of its line left in the file is ended by the next line's leading newline, never
  glued to it; a file deleted while written takes no more lines (``publish`` raises); a
  failed ``fsync`` is a ``NotDurableError`` (a ``PublishError``) counting the lines written
  since the last flush.
- ``PubSubSink`` publishes the line as the message data with attributes ``event_time`` and
  ``message_id``; with ``ordering_by_join=True`` the ordering key is the ``join_id`` and message
  ordering is enabled in the client it creates. The client's own retry policy applies to each
  publish (``retry``/``timeout`` override it); a message that still fails is reported by the
  next ``flush``/``close``, and its ordering key is resumed so later messages of that join can be
  published again.
- ``PubSubSink`` holds a message only until its publish is confirmed (then it is released), or
  until a failure is reported. It holds at most ``max_held`` messages / ``max_held_bytes``
  bytes: a ``publish`` beyond that waits for room (back-pressure) for up to
  ``flush_timeout_s``, then raises ``PublishError`` for that message, which is not sent.
- ``flush_timeout_s`` bounds a whole ``flush``: when it passes, every publish not yet confirmed
  is reported in the ``PublishError`` as not confirmed in time (it may still arrive), next to
  the messages that failed, each with its reason. A flush that waits ``NOTICE_S`` (5 s) says
  so once, in a warning of logger ``fanin.sdk.sinks`` (how many messages, until when), rather
  than waiting in silence for Pub/Sub (or an emulator) that does not answer.
- ``PubSubSink.close`` delivers every message published before it (or reports it in its
  ``PublishError``): a client the sink created is stopped first when ordering is off (the
  pending batches are sent at once), and only after every pending publish is confirmed, failed
  or given up on by the flush when ``ordering_by_join=True`` (the client's stop sends just the
  first pending batch of each ordering key and cancels the others).
- At interpreter exit, every ``JsonlFileSink``/``PubSubSink`` still holding unflushed messages
  is closed (so flushed), after an ``UnflushedMessagesWarning`` naming the sink and the count;
  a failure of that flush is a second warning; also at the end of a ``multiprocessing`` child
  (a pool worker, a forked ``Process``). A forked child never writes its parent's messages
  again (``JsonlFileSink`` buffers nothing in the process); it may write through a
  ``JsonlFileSink`` it inherited, but not through an inherited ``PubSubSink`` (make one in each
  process: the Pub/Sub client does not survive ``fork``). Close your sinks (or use ``with``).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import threading
import time
import warnings
import weakref
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

_LOG = logging.getLogger(__name__)

__all__ = [
    "EncodedMessage",
    "JsonlFileSink",
    "MemorySink",
    "NotDurableError",
    "PubSubSink",
    "PublishError",
    "Sink",
    "UnflushedMessagesWarning",
]


@dataclass(frozen=True)
class EncodedMessage:
    """One encoded message: the JSON line and the attributes a transport may need."""

    line: str
    join_id: str
    message_id: str
    event_time: str


def describe_failure(exc: BaseException) -> str:
    """``"Type: text"`` of a publish failure, never empty (``repr`` when ``str`` is)."""
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text}"


class PublishError(RuntimeError):
    """Some messages could not be published; ``failures`` holds each with its exception.

    The text names the first 20 (message_id, join_id, event_time, reason) and counts the rest.
    """

    def __init__(self, failures: Sequence[tuple[EncodedMessage, BaseException]]) -> None:
        self.failures = list(failures)
        shown = "; ".join(f"message_id={m.message_id} join_id={m.join_id} "
                          f"event_time={m.event_time}: {describe_failure(e)}"
                          for m, e in self.failures[:20])
        more = f"; ... and {len(self.failures) - 20} more" if len(self.failures) > 20 else ""
        super().__init__(f"{len(self.failures)} message(s) failed to publish: {shown}{more}")


class NotDurableError(PublishError):
    """A ``JsonlFileSink``'s ``flush``/``close`` could not make the lines written since the
    last flush durable (their ``fsync`` failed, or the file was deleted): ``count`` of them,
    not kept by the sink, so not listed in ``failures`` (empty); ``cause`` is the error."""

    def __init__(self, path: Path, count: int, cause: OSError) -> None:
        self.path, self.count, self.cause = path, count, cause
        super().__init__([])
        self.args = (f"{count} message(s) written to {path} since the last flush may not be "
                     f"durable: {describe_failure(cause)}",)


class UnflushedMessagesWarning(RuntimeWarning):
    """A sink still held unflushed messages when the interpreter exited."""


_S = TypeVar("_S", bound="Sink")


class Sink(ABC):
    """What an ``Emitter`` writes to; ``with sink:`` closes it (surfacing failures) on exit.
    ``max_message_bytes``: the largest message the transport takes (``None``: no limit); an
    ``Emitter`` whose ``max_bytes`` is larger is refused."""

    max_message_bytes: int | None = None

    @abstractmethod
    def publish(self, message: EncodedMessage) -> None:
        """Hand one message to the transport (may buffer)."""

    @abstractmethod
    def flush(self) -> None:
        """Block until every message so far is delivered; raise ``PublishError`` otherwise."""

    @abstractmethod
    def close(self) -> None:
        """Flush, then release resources; idempotent."""

    def unflushed(self) -> int:
        """Messages published but not yet flushed (0 for sinks that buffer nothing)."""
        return 0

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


_OPEN_SINKS: weakref.WeakSet[Sink] = weakref.WeakSet()


def _close_at_exit() -> None:
    """Close every open sink that still holds unflushed messages, warning about each."""
    for sink in list(_OPEN_SINKS):
        count = sink.unflushed()
        if not count:
            continue
        warnings.warn(f"{sink!r} held {count} unflushed message(s) at interpreter exit; "
                      "flushing them now. Close the Emitter (or use `with Emitter(...)`) "
                      "so that delivery is confirmed, and failures raised, in your code.",
                      UnflushedMessagesWarning, stacklevel=1)
        try:
            sink.close()
        except Exception as exc:  # at exit there is no caller left to raise to
            warnings.warn(f"{sink!r}: flushing at exit failed: {exc}", UnflushedMessagesWarning,
                          stacklevel=1)


_EXIT_HOOKED_IN: int | None = None  # the process whose multiprocessing exit runs the hook


def _after_fork_in_child() -> None:
    """A forked child keeps the parent's file sinks usable (``JsonlFileSink._forked``) and
    stops tracking its ``PubSubSink``\\s: their client's threads and gRPC channel did not
    cross the fork, so the child can neither use nor flush them (the parent does)."""
    for sink in list(_OPEN_SINKS):
        if isinstance(sink, JsonlFileSink):
            sink._forked()
        else:
            _OPEN_SINKS.discard(sink)


if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _watch_at_exit(sink: Sink) -> None:
    """Track ``sink`` for ``_close_at_exit``, which is (re-)registered last, so it runs before
    the exit handlers of libraries imported since (e.g. the Pub/Sub client's). A
    ``multiprocessing`` child ends with ``os._exit``, which runs no ``atexit`` handler (a
    forked pool worker's sink lost its messages without a word): there the hook runs as one of
    the finalizers ``multiprocessing`` runs at a child's end, registered once per process."""
    global _EXIT_HOOKED_IN
    _OPEN_SINKS.add(sink)
    atexit.unregister(_close_at_exit)
    atexit.register(_close_at_exit)
    if os.getpid() != _EXIT_HOOKED_IN:
        import multiprocessing.util

        multiprocessing.util.Finalize(None, _close_at_exit, exitpriority=100)
        _EXIT_HOOKED_IN = os.getpid()


class JsonlFileSink(Sink):
    """Appends one line per message to ``path`` (created if absent).

    Each line is handed to the operating system by one ``write`` of the file opened for
    appending as it is published (no buffer in the process): so a line is never half written
    next to another process's, a ``fork`` copies no pending lines (a forked child exiting
    cannot write its parent's lines again), and nothing is lost when a ``multiprocessing``
    child ends with ``os._exit``. ``flush`` and ``close`` ``fsync`` the file (durable; a pipe,
    a terminal or another file that cannot be synchronised, ``/dev/stdout`` say, has nothing
    to make durable). The cost is two system calls per line (the ``write``, and an ``fstat``
    that sees a deleted file): ~2 µs on a local disk, more on a network file system.

    Failures are ``PublishError``\\s. A ``write`` that fails (a full disk) raises one for its
    message; if it wrote part of the line first, the next line begins with a newline, so the
    part stays a line of its own (``fanin run`` dead-letters it: ``invalid_json``; or, when
    only the newline was missing, reads the message whose publish raised) and never spoils
    the next line, the retry included. A file deleted while the sink writes to it (no name
    left) takes no more lines: ``publish`` raises; ``flush`` and ``close`` raise
    ``NotDurableError`` for the lines written since the last flush when the file was deleted,
    or the ``fsync`` failed.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                                       | getattr(os, "O_CLOEXEC", 0)
                                       | getattr(os, "O_BINARY", 0), 0o666)
        self._unflushed = 0
        self._cut = False  # the file may end in part of a line a failed write left
        _watch_at_exit(self)

    def __repr__(self) -> str:
        return f"JsonlFileSink({str(self.path)!r})"

    def publish(self, message: EncodedMessage) -> None:
        data = (message.line + "\n").encode("utf-8")
        with self._lock:
            fd = self._fd
            if fd is None:
                raise ValueError(f"{self.path}: sink is closed")
            head = b"\n" if self._cut else b""
            view = memoryview(head + data)
            written = 0
            try:
                if self._deleted(fd):
                    raise FileNotFoundError(f"{self.path} was deleted while the sink wrote "
                                            "to it")
                while written < len(view):  # a regular file takes it whole; a short write
                    written += os.write(fd, view[written:])  # goes on from there
            except OSError as exc:
                if written:  # the newline ended the part left before; this line's part?
                    self._cut = written > len(head)
                raise PublishError([(message, exc)]) from exc
            self._cut = False
            self._unflushed += 1

    def unflushed(self) -> int:
        """Lines written since the last ``flush``/``close`` (not yet ``fsync``ed)."""
        return self._unflushed

    def flush(self) -> None:
        with self._lock:
            if self._fd is not None:
                self._sync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    self._sync(fd)
                finally:
                    os.close(fd)

    def _sync(self, fd: int) -> None:
        """``fsync``; the lines written since the last one are then durable, or
        ``NotDurableError`` says how many may not be (``_lock`` held)."""
        count, self._unflushed = self._unflushed, 0
        try:
            if self._deleted(fd):
                raise FileNotFoundError(f"{self.path} was deleted while the sink wrote to it")
            os.fsync(fd)
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # a pipe, a terminal...: nothing to synchronise
                return
            if count:
                raise NotDurableError(self.path, count, exc) from exc

    def _deleted(self, fd: int) -> bool:
        """The file has no name left (deleted while open; a file replaced at ``path`` is
        another file)."""
        opened = os.fstat(fd)
        if opened.st_nlink:
            return False
        try:  # a file system that counts no links: the file is still at its path
            return not os.path.samestat(opened, os.stat(self.path))
        except OSError:
            return True

    def __del__(self) -> None:
        """A sink dropped unclosed gives its descriptor back (its lines were written already;
        the exit hook ``fsync``s the sinks still referenced)."""
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _forked(self) -> None:
        """In a forked child: a fresh lock (another thread may have held the parent's), and
        no lines to ``fsync`` (the parent's are its own to make durable)."""
        self._lock = threading.Lock()
        self._unflushed = 0


class _Held:
    """One message the sink holds: until its publish is confirmed, or its failure reported."""

    __slots__ = ("message", "size")

    def __init__(self, message: EncodedMessage, size: int) -> None:
        self.message = message
        self.size = size


class PubSubSink(Sink):
    """Publishes to a Pub/Sub ``topic`` (``projects/P/topics/T``) with batching.

    ``publisher`` injects a client (anything with ``publish(topic, data, ordering_key=...,
    **attributes) -> Future`` and ``resume_publish(topic, ordering_key)``); when omitted a
    ``google.cloud.pubsub_v1.PublisherClient`` is created with ``batch_settings`` (default: up to
    100 messages, 1 MB or 50 ms per batch), and stopped by ``close``.

    ``flush_timeout_s`` (``None``: no limit) is the deadline of a whole ``flush`` and the longest
    a ``publish`` waits for room; ``max_held``/``max_held_bytes`` bound the messages held (see
    the module docstring). Pub/Sub takes at most 10,000,000 bytes a message, attributes
    included: ``max_message_bytes`` leaves them 100,000.
    """

    max_message_bytes = 9_900_000

    def __init__(self, topic: str, ordering_by_join: bool = False, *, publisher: Any = None,
                 batch_settings: Any = None, retry: Any = None, timeout: float | None = None,
                 flush_timeout_s: float | None = 300.0, max_held: int = 10_000,
                 max_held_bytes: int = 64 * 1024 * 1024) -> None:
        if max_held < 1 or max_held_bytes < 1:
            raise ValueError("max_held and max_held_bytes must be >= 1")
        self.topic = topic
        self.ordering_by_join = ordering_by_join
        self._owned = publisher is None
        if publisher is None:
            import google.cloud.pubsub_v1 as pubsub_v1

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
        self._max_held = max_held
        self._max_held_bytes = max_held_bytes
        self._changed = threading.Condition()
        self._in_flight: dict[int, _Held] = {}  # by sequence number, oldest first
        self._failures: list[tuple[EncodedMessage, BaseException]] = []
        self._failed_bytes = 0
        self._held_bytes = 0
        self._paused: set[str] = set()
        self._sequence = 0
        self._closed = False
        _watch_at_exit(self)

    def __repr__(self) -> str:
        return f"PubSubSink({self.topic!r})"

    def held(self) -> int:
        """Messages held now: publishes not yet confirmed, and failures not yet reported."""
        with self._changed:
            return len(self._in_flight) + len(self._failures)

    unflushed = held

    def _deadline(self) -> float | None:
        return None if self._flush_timeout_s is None else \
            time.monotonic() + self._flush_timeout_s

    NOTICE_S = 5.0  # a flush waiting this long says so (once)

    def _wait(self, condition: Any, deadline: float | None,
              notice: Any = None) -> bool:
        """Wait (holding ``_changed``) until ``condition()`` or the deadline; True if it holds.
        ``notice()`` is called once if the wait lasts ``NOTICE_S``."""
        notice_at = time.monotonic() + self.NOTICE_S if notice is not None else None
        while not condition():
            now = time.monotonic()
            remaining = None if deadline is None else deadline - now
            if remaining is not None and remaining <= 0:
                return False
            if notice_at is not None:
                if now >= notice_at:
                    notice()
                    notice_at = None
                    continue
                remaining = notice_at - now if remaining is None else \
                    min(remaining, notice_at - now)
            self._changed.wait(remaining)
        return True

    def _waiting(self) -> None:
        """The notice of a flush that waits (holding ``_changed``)."""
        until = "without a limit" if self._flush_timeout_s is None else \
            f"for up to flush_timeout_s={self._flush_timeout_s:g}s in all"
        _LOG.warning("fanin: %r: a flush waits for Pub/Sub: %d message(s) not confirmed after "
                     "%gs; waiting %s", self, len(self._in_flight), self.NOTICE_S, until)

    def publish(self, message: EncodedMessage) -> None:
        """Hand ``message`` to the client; waits while the sink holds its maximum (see class)."""
        data = message.line.encode("utf-8")
        size = len(data)
        with self._changed:
            if self._closed:
                raise ValueError(f"{self.topic}: sink is closed")

            def room() -> bool:
                held = len(self._in_flight) + len(self._failures)
                return held == 0 or (held < self._max_held and
                                     self._held_bytes + size <= self._max_held_bytes)

            if not self._wait(room, self._deadline()):
                raise PublishError([(message, TimeoutError(
                    f"not sent: the sink held {len(self._in_flight)} unconfirmed and "
                    f"{len(self._failures)} unreported failed message(s) "
                    f"({self._held_bytes} bytes) for {self._flush_timeout_s:g}s "
                    f"(max_held={self._max_held}, max_held_bytes={self._max_held_bytes}); "
                    "is Pub/Sub reachable? flush() reports the failures"))])
            self._sequence += 1
            sequence = self._sequence
            held = self._in_flight[sequence] = _Held(message, size)
            self._held_bytes += size
        try:
            future = self._publisher.publish(
                self.topic, data, ordering_key=message.join_id if self.ordering_by_join else "",
                event_time=message.event_time, message_id=message.message_id, **self._options)
        except BaseException:
            with self._changed:
                self._release(sequence)
            raise
        future.add_done_callback(lambda done: self._settled(sequence, held, done))

    def _release(self, sequence: int) -> _Held | None:
        held = self._in_flight.pop(sequence, None)
        if held is not None:
            self._held_bytes -= held.size
            self._changed.notify_all()
        return held

    def _settled(self, sequence: int, held: _Held, future: Future[Any]) -> None:
        """The publish of ``held`` resolved: release it, or keep its failure for ``flush``."""
        exc = future.exception()
        with self._changed:
            if exc is not None and self.ordering_by_join:
                self._paused.add(held.message.join_id)
            if self._release(sequence) is not None and exc is not None:
                self._failures.append((held.message, exc))
                self._held_bytes += held.size
                self._failed_bytes += held.size

    def flush(self) -> None:
        """Wait until every publish so far is confirmed, for at most ``flush_timeout_s`` in all;
        raise ``PublishError`` listing those that failed or were not confirmed in time."""
        deadline = self._deadline()
        with self._changed:
            last = self._sequence
            done = self._wait(lambda: not self._in_flight or next(iter(self._in_flight)) > last,
                              deadline, self._waiting)
            if not done:
                late = [n for n in self._in_flight if n <= last]
                for sequence in late:
                    held = self._release(sequence)
                    if held is None:
                        raise RuntimeError(f"publish {sequence} is in flight but not held")
                    self._failures.append((held.message, TimeoutError(
                        f"not confirmed within flush_timeout_s={self._flush_timeout_s:g}s "
                        "(the publish is still in flight and may yet be delivered)")))
            failures, self._failures = self._failures, []
            self._held_bytes -= self._failed_bytes
            self._failed_bytes = 0
            paused, self._paused = (set(), set()) if self._closed else (self._paused, set())
            self._changed.notify_all()
        for join_id in paused:
            self._publisher.resume_publish(self.topic, join_id)
        if failures:
            raise PublishError(failures)

    def close(self) -> None:
        """Deliver every message published so far, then release the client; raises like
        ``flush``. Idempotent.

        A client this sink created is stopped: without ordering first, which sends every
        pending batch at once, then the sink flushes; with ``ordering_by_join=True`` after the
        flush (the client's stop would send only the first pending batch of each ordering key
        and cancel the rest: its batches go one after another, each when the previous one is
        confirmed, as ordering requires), and also when the flush raises. An injected client
        is flushed, not stopped. Publishes a flush gave up on are left to the client's retries
        (daemon threads: they never delay the interpreter's exit); with ordering, stopping the
        client cancels those still queued behind another batch of their join.
        """
        with self._changed:
            if self._closed:
                return
            self._closed = True
        if not self._owned:
            self.flush()
        elif self.ordering_by_join:
            try:
                self.flush()
            finally:
                self._publisher.stop()
        else:
            self._publisher.stop()
            self.flush()
