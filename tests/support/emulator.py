"""Google's Pub/Sub emulator (``gcloud beta emulators pubsub start``) for the tests.

``PubSubEmulator`` runs the real emulator (a Java program, Debian package
``google-cloud-cli-pubsub-emulator``) on a free port of 127.0.0.1 with its own data folder,
in its own process group (the gcloud wrapper spawns a ``java`` child; stopping kills the whole
group). It waits until the emulator answers, polling with a deadline, never a fixed sleep.

Topics and subscriptions are created with the real ``google-cloud-pubsub`` client under unique
names (one emulator serves the whole test session). The emulator keeps no state across a
restart, so ``restart()`` re-creates every topic and subscription made through this object (an
outage of the service, not a loss of its configuration); messages it held are gone, as they
would be if the emulator itself were lost.

The pytest fixture ``pubsub_emulator`` (session scope, in ``tests/conftest.py``) starts one and
sets ``PUBSUB_EMULATOR_HOST`` for the session; when the emulator is not installed the tests that
use it fail with one line saying so.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROJECT = "fanin-emulated"
_START_TIMEOUT_S = 90.0
_STOP_TIMEOUT_S = 10.0

__all__ = ["PROJECT", "EmulatorMissing", "PubSubEmulator", "emulator_command", "wait_for"]


class EmulatorMissing(RuntimeError):
    """The emulator is not installed; the message is one line for the test report."""


def wait_for(condition: Callable[[], Any], timeout_s: float, interval_s: float = 0.05) -> Any:
    """Poll ``condition`` until it returns something truthy (returned) or ``timeout_s`` passes
    (returns the last falsy value). Never sleeps longer than ``interval_s`` at a time."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


def emulator_command(host_port: str, data_dir: Path) -> list[str]:
    """The command that starts the emulator; ``EmulatorMissing`` when it is not installed."""
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise EmulatorMissing("Pub/Sub emulator missing: `gcloud` is not on PATH (install the "
                              "Debian packages google-cloud-cli and "
                              "google-cloud-cli-pubsub-emulator)")
    sdk_root = Path(os.path.realpath(gcloud)).parent.parent
    candidates = [sdk_root / "platform" / "pubsub-emulator",
                  Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator")]
    if not any(c.is_dir() for c in candidates):
        raise EmulatorMissing("Pub/Sub emulator missing: no platform/pubsub-emulator in the "
                              "Google Cloud SDK (install the Debian package "
                              "google-cloud-cli-pubsub-emulator)")
    if shutil.which("java") is None:
        raise EmulatorMissing("Pub/Sub emulator cannot start: `java` is not on PATH (it needs "
                              "a Java runtime, e.g. the Debian package openjdk-17-jre-headless)")
    return [gcloud, "beta", "emulators", "pubsub", "start", f"--host-port={host_port}",
            f"--data-dir={data_dir}"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PubSubEmulator:
    """One running emulator: ``host`` (``127.0.0.1:PORT``), ``project``, and helpers.

    - ``topic()`` / ``subscription(topic)``: create a uniquely named topic / subscription and
      return its path (``projects/<project>/topics/<name>``...).
    - ``publish(topic, data, **attributes)``: publish one message and wait until it is stored.
    - ``pull(subscription)``: one immediate pull (acknowledged); ``collect(subscription, done,
      timeout_s)``: pull until ``done(messages)`` holds or the deadline passes.
    - ``stop()``, ``start()``, ``restart()``: for fault tests (same port; ``restart`` restores
      the topics and subscriptions).
    """

    def __init__(self, data_dir: Path, project: str = PROJECT) -> None:
        self.project = project
        self._data_dir = data_dir
        self._port = _free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = data_dir / "emulator.log"
        self._names = itertools.count(1)
        self._session = uuid.uuid4().hex[:6]
        self._topics: list[str] = []
        self._subscriptions: list[tuple[str, str, int]] = []
        self._publisher: Any = None
        self._subscriber: Any = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self._port}"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the emulator and return once it answers; ``RuntimeError`` (with the end of its
        log) if it exits or does not answer within 90 s."""
        command = emulator_command(self.host, self._data_dir)
        self._data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self._log_path, "ab")  # noqa: SIM115 - owned by the child process
        try:
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        process = self._process
        if not wait_for(lambda: process.poll() is not None or self._answers(),
                        _START_TIMEOUT_S, 0.1) or process.poll() is not None:
            self.stop()
            raise RuntimeError(f"Pub/Sub emulator did not start on {self.host}:\n"
                               + self.log_tail())

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}/", timeout=1) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def stop(self) -> None:
        """Stop the emulator: SIGTERM to its whole process group, SIGKILL after 10 s."""
        self._close_clients()
        process, self._process = self._process, None
        if process is None or not self._group_alive(process):
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            if wait_for(lambda: not self._group_alive(process), _STOP_TIMEOUT_S, 0.05):
                break
        process.wait(timeout=_STOP_TIMEOUT_S)

    @staticmethod
    def _group_alive(process: subprocess.Popen[bytes]) -> bool:
        """Whether any process of the group led by ``process`` still runs (reaping the leader
        first: a zombie still counts as a member)."""
        process.poll()
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def restart(self, while_down: Callable[[], Any] | None = None) -> None:
        """Stop and start again on the same port (calling ``while_down()`` in between), then
        re-create the topics and subscriptions (the emulator forgets them, and every message it
        held, when it stops)."""
        self.stop()
        if while_down is not None:
            while_down()
        self.start()
        for topic in self._topics:
            self.publisher.create_topic(name=topic)
        for name, topic, ack_deadline_s in self._subscriptions:
            self.subscriber.create_subscription(name=name, topic=topic,
                                                ack_deadline_seconds=ack_deadline_s)

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines the emulator printed."""
        try:
            text = self._log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- clients ---------------------------------------------------------------------------
    @property
    def publisher(self) -> Any:
        """A ``pubsub_v1.PublisherClient`` bound to this emulator."""
        if self._publisher is None:
            from google.cloud import pubsub_v1

            os.environ["PUBSUB_EMULATOR_HOST"] = self.host
            self._publisher = pubsub_v1.PublisherClient()
        return self._publisher

    @property
    def subscriber(self) -> Any:
        """A ``pubsub_v1.SubscriberClient`` bound to this emulator."""
        if self._subscriber is None:
            from google.cloud import pubsub_v1

            os.environ["PUBSUB_EMULATOR_HOST"] = self.host
            self._subscriber = pubsub_v1.SubscriberClient()
        return self._subscriber

    def _close_clients(self) -> None:
        publisher, self._publisher = self._publisher, None
        subscriber, self._subscriber = self._subscriber, None
        if publisher is not None:
            publisher.stop()
            publisher.transport.close()
        if subscriber is not None:
            subscriber.close()

    # -- resources -------------------------------------------------------------------------
    def _unique(self, hint: str) -> str:
        return f"{hint}-{self._session}-{next(self._names)}"

    def topic(self, hint: str = "topic") -> str:
        """Create a new topic named after ``hint``; returns its path."""
        path = f"projects/{self.project}/topics/{self._unique(hint)}"
        self.publisher.create_topic(name=path)
        self._topics.append(path)
        return path

    def subscription(self, topic: str, hint: str = "sub", ack_deadline_s: int = 10) -> str:
        """Create a new subscription to ``topic`` (ack deadline ``ack_deadline_s``, 10-600 s);
        returns its path."""
        path = f"projects/{self.project}/subscriptions/{self._unique(hint)}"
        self.subscriber.create_subscription(name=path, topic=topic,
                                            ack_deadline_seconds=ack_deadline_s)
        self._subscriptions.append((path, topic, ack_deadline_s))
        return path

    def topic_and_subscription(self, hint: str = "t", ack_deadline_s: int = 10) -> tuple[str, str]:
        """A new topic and a subscription to it: ``(topic, subscription)``."""
        topic = self.topic(hint)
        return topic, self.subscription(topic, hint, ack_deadline_s)

    def publish(self, topic: str, data: bytes, **attributes: str) -> str:
        """Publish one message and wait until the emulator stored it; returns its message id."""
        return self.publisher.publish(topic, data, **attributes).result(timeout=30)

    def pull(self, subscription: str, max_messages: int = 1000, ack: bool = True) -> list[Any]:
        """One pull that returns at once: the messages (``PubsubMessage`` protos) available now,
        acknowledged unless ``ack=False``."""
        response = self.subscriber.pull(subscription=subscription, max_messages=max_messages,
                                        return_immediately=True, timeout=30)
        received = list(response.received_messages)
        if ack and received:
            self.subscriber.acknowledge(subscription=subscription,
                                        ack_ids=[m.ack_id for m in received])
        return [m.message for m in received]

    def collect(self, subscription: str, done: Callable[[list[Any]], bool],
                timeout_s: float) -> list[Any]:
        """Pull (and acknowledge) until ``done(every message so far)`` holds or ``timeout_s``
        passes; returns every message pulled."""
        got: list[Any] = []

        def enough() -> bool:
            got.extend(self.pull(subscription))
            return done(got)

        wait_for(enough, timeout_s, 0.1)
        return got
