"""Publishing a newline-delimited file (or standard input) to a Pub/Sub topic (``fanin publish``).

Guarantees of ``publish_file``:
- Messages: the lines ``fanin run --input`` reads as messages (``fanin.contracts.lines.
  message_lines``: line endings and a leading byte order mark removed, empty lines skipped,
  whitespace-only lines kept) of the file as ``fanin run`` reads it (``fanin.io.inputs.
  input_lines``: a ``.gz``, ``.bz2``, ``.zst``, ``.xz``... file decompressed), each published
  with its bytes unchanged, so a line ``fanin run`` dead-letters from a file it dead-letters
  from Pub/Sub too. A compressed file not of its suffix's format raises ``UnreadableInput``
  (a ``ValueError``) before anything is published; one damaged (or cut short) further on
  ends the reading where the damage is: the lines before it are published and counted, and
  the summary's ``unreadable`` says where and why. A line longer than Pub/Sub's limit
  (``PUBSUB_LINE_BYTES``) is never held whole: its first bytes fail alone, as the client's
  ``MessageTooLargeError``.
  Attributes: ``event_time`` (a receipt's ``event_time``, an open's ``opened_at``, else the
  other one) and ``message_id`` when the line is a JSON object with such string fields of at
  most 1024 bytes.
- Accounting: every message read is counted exactly once, in ``sent`` (confirmed by Pub/Sub) or
  ``failed``. Failures are grouped by kind (exception type and the first line of its text, at
  most ``MAX_KINDS`` kinds, then ``other``), each with its count and first and last line.
- Memory is bounded: at most ``MAX_IN_FLIGHT`` unconfirmed messages; reading waits for room.
- Waiting: while messages are in flight and none has been confirmed or failed for
  ``NOTICE_S`` seconds (or half ``timeout_s``, if less), ``waiting(seconds)`` is called once;
  after ``timeout_s`` seconds of silence it gives up: the messages in flight and the lines not
  read yet (counted to the end of the input) are failed as ``not confirmed ...`` /
  ``not sent ...``.
- Interruption: when ``stop`` is set (``fanin publish`` sets it on Ctrl-C) it reads no further
  line, gives the messages in flight ``grace_s`` seconds to settle (those left are failed as
  ``interrupted ...``; they may still arrive) and returns with ``interrupted=True``; lines not
  read are not counted.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from fanin.contracts.lines import message_lines
from fanin.io.credentials import unreadable_credentials
from fanin.io.inputs import (
    PUBSUB_LINE_BYTES,
    UnreadableInput,
    check_start,
    input_lines,
    stream_lines,
)
from fanin.io.pubsub import validate_topic_path

__all__ = ["MAX_IN_FLIGHT", "MAX_KINDS", "NOTICE_S", "FailureKind", "PublishSummary",
           "publish_file"]

MAX_IN_FLIGHT = 1000
MAX_KINDS = 20
NOTICE_S = 5.0
_MAX_ATTRIBUTE_BYTES = 1024  # Pub/Sub's limit for an attribute value
_MAX_KIND_CHARS = 300


@dataclass(frozen=True)
class FailureKind:
    """Messages that failed the same way: ``error`` (``"Type: first line"``), how many, where."""

    error: str
    count: int
    first_line: int
    last_line: int


@dataclass(frozen=True)
class PublishSummary:
    """Outcome of ``publish_file``: every message read is in ``sent`` or ``failed``."""

    sent: int
    failed: int
    kinds: tuple[FailureKind, ...] = ()
    interrupted: bool = False
    unreadable: str | None = None  # the damage that ended the reading of a compressed file


_GONE = object()


class _Publishing:
    """The state of one ``publish_file`` call; counts change in the client's callback threads,
    always under ``changed``."""

    def __init__(self, progress: Callable[[int, int], None] | None,
                 waiting: Callable[[float], None] | None) -> None:
        self.changed = threading.Condition()
        self.progress = progress
        self.waiting = waiting
        self.sent = 0
        self.failed = 0
        self.in_flight: dict[int, None] = {}  # line numbers, oldest first
        self.busy_since = time.monotonic()  # the last settle, or the start of a busy period
        self.kinds: dict[str, list[int]] = {}  # error -> [count, first line, last line]

    def fail(self, first: int, error: str, count: int = 1, last: int | None = None) -> None:
        if error not in self.kinds and len(self.kinds) >= MAX_KINDS:
            error = "other errors"
        kind = self.kinds.setdefault(error, [0, first, first])
        kind[0] += count
        kind[1] = min(kind[1], first)
        kind[2] = max(kind[2], first if last is None else last)
        self.failed += count

    def sending(self, line_no: int) -> None:
        with self.changed:
            if not self.in_flight:
                self.busy_since = time.monotonic()
            self.in_flight[line_no] = None

    def settled(self, line_no: int, future: Any) -> None:
        error = future.exception()
        with self.changed:
            if self.in_flight.pop(line_no, _GONE) is _GONE:
                return  # already counted as not confirmed in time
            self.busy_since = time.monotonic()
            if error is None:
                self.sent += 1
            else:
                self.fail(line_no, _kind(error))
            if self.progress is not None:
                self.progress(self.sent, self.failed)
            self.changed.notify_all()

    def give_up_in_flight(self, reason: str) -> None:
        """Count every message still in flight as failed with ``reason`` (holding ``changed``)."""
        if self.in_flight:
            lines = list(self.in_flight)
            self.fail(lines[0], reason, len(lines), lines[-1])
            self.in_flight.clear()

    def wait(self, done: Callable[[], bool], patience_s: float, stop: threading.Event,
             deadline: float | None = None) -> bool:
        """Wait (holding ``changed``) until ``done()``. False when ``patience_s`` seconds pass
        without a message settling, at ``deadline``, or (without a deadline) once ``stop`` is
        set. Calls ``waiting`` once per silence longer than ``NOTICE_S`` (or half the patience)."""
        noticed = False
        notice_s = min(NOTICE_S, patience_s / 2)
        while not done():
            now = time.monotonic()
            silent = now - self.busy_since
            if silent >= patience_s or (deadline is None and stop.is_set()) or \
                    (deadline is not None and now >= deadline):
                return False
            if not noticed and silent >= notice_s and self.waiting is not None:
                noticed = True
                self.waiting(silent)
            self.changed.wait(0.1)
        return True

    def summary(self, interrupted: bool) -> PublishSummary:
        kinds = tuple(FailureKind(error, count, first, last)
                      for error, (count, first, last) in self.kinds.items())
        return PublishSummary(self.sent, self.failed, kinds, interrupted)


def _kind(exc: BaseException) -> str:
    text = (str(exc) or repr(exc)).strip().split("\n", 1)[0]
    kind = f"{type(exc).__name__}: {text}"
    return kind if len(kind) <= _MAX_KIND_CHARS else kind[:_MAX_KIND_CHARS] + "..."


def _line_attributes(line: bytes) -> dict[str, str]:
    """``event_time`` (the open's ``opened_at``, a receipt's ``event_time``) and ``message_id``."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(obj, dict):
        return {}
    names = (
        ("opened_at", "event_time") if obj.get("kind") == "open" else ("event_time", "opened_at")
    )
    candidates = {
        "event_time": next((obj[n] for n in names if isinstance(obj.get(n), str)), None),
        "message_id": obj.get("message_id"),
    }
    attributes: dict[str, str] = {}
    for key, value in candidates.items():
        if not isinstance(value, str):
            continue
        try:
            fits = 0 < len(value.encode("utf-8")) <= _MAX_ATTRIBUTE_BYTES
        except UnicodeEncodeError:  # a lone surrogate from a JSON escape
            fits = False
        if fits:
            attributes[key] = value
    return attributes


def _until_damage(lines: Iterable[tuple[bytes, int]], damage: list[str]
                  ) -> Iterator[tuple[bytes, int]]:
    """``lines`` up to the damage of a compressed file, if any, whose text is then put in
    ``damage`` (the lines before it are sent and counted)."""
    try:
        yield from lines
    except UnreadableInput as exc:
        damage.append(str(exc))


@contextmanager
def _input(path: str) -> Iterator[Iterable[bytes]]:
    if path == "-":
        yield stream_lines(sys.stdin.buffer, PUBSUB_LINE_BYTES)
    else:  # decompressed by its name's suffix (.gz, .bz2, ...), as ``fanin run`` reads it
        with input_lines(path, PUBSUB_LINE_BYTES) as lines:
            yield lines


def publish_file(
    topic: str,
    path: str,
    progress: Callable[[int, int], None] | None = None,
    *,
    timeout_s: float = 60.0,
    waiting: Callable[[float], None] | None = None,
    stop: threading.Event | None = None,
    grace_s: float = 10.0,
) -> PublishSummary:
    """Publish every message of ``path`` (``-``: standard input) to ``topic``; see the module.

    ``progress(sent, failed)`` is called after each message settles (from the client's
    threads). Publishing errors never raise. A malformed topic path or credentials that cannot
    be read (``unreadable_credentials``) raise ``ValueError`` and
    an unreadable file ``OSError`` and a compressed file not of its suffix's format
    ``UnreadableInput`` before anything is published. Uses
    ``google.cloud.pubsub_v1.PublisherClient``, which honours ``PUBSUB_EMULATOR_HOST``.
    """
    import google.cloud.pubsub_v1 as pubsub_v1

    validate_topic_path(topic)
    if path != "-":
        check_start(path)  # a file that is not of its suffix's format: before anything is sent
    stop = stop or threading.Event()
    state = _Publishing(progress, waiting)
    silence = f"no confirmation from Pub/Sub for {timeout_s:g} s (gave up)"
    try:
        client = pubsub_v1.PublisherClient()
    except OSError as error:  # not of the input: of the credentials file
        raise unreadable_credentials(error) from None
    damage: list[str] = []
    with _input(path) as handle:
        lines = _until_damage(message_lines(handle), damage)
        try:
            gave_up = False
            for line, line_no in lines:
                with state.changed:
                    room = state.wait(lambda: len(state.in_flight) < MAX_IN_FLIGHT, timeout_s,
                                      stop)
                    gave_up = not room and not stop.is_set()
                    if gave_up:
                        state.fail(line_no, f"not sent: {silence}")
                if stop.is_set() or gave_up:
                    break
                try:
                    future = client.publish(topic, line, **_line_attributes(line))
                except Exception as exc:  # refused before sending, e.g. over the size limit
                    with state.changed:
                        state.fail(line_no, _kind(exc))
                    continue
                state.sending(line_no)
                future.add_done_callback(lambda done, n=line_no: state.settled(n, done))
            if gave_up:
                rest = [n for _, n in lines]
                if rest:
                    with state.changed:
                        state.fail(rest[0], f"not sent: {silence}", len(rest), rest[-1])
            with state.changed:
                if not stop.is_set():  # every line read: the confirmations (Ctrl-C ends it)
                    state.wait(lambda: not state.in_flight, timeout_s, stop)
                # Ctrl-C, while reading or during that wait: what is in flight gets grace_s
                interrupted = stop.is_set()
                if interrupted:
                    state.wait(lambda: not state.in_flight, timeout_s, stop,
                               time.monotonic() + grace_s)
                if state.in_flight:
                    state.give_up_in_flight(
                        "interrupted before Pub/Sub confirmed it (it may still arrive)"
                        if interrupted else f"not confirmed: {silence}; it may still arrive")
                return replace(state.summary(interrupted), unreadable=next(iter(damage), None))
        finally:
            client.stop()
