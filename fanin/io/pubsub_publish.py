"""Publishing outputs to a Pub/Sub topic on the local runner without failing the run.

On the local runner (BundleBasedDirectRunner) a failed bundle aborts the whole job, and the
messages of its open joins, acknowledged when they were pulled, live only in the process
(docs/reliability.md). Beam's ``WriteToPubSub`` raises when a publish fails (a topic deleted
while the run reads, the service unreachable): one output topic failing lost every message
of the run, its output files included. ``PublishLocally`` publishes instead, and a topic is
what docs/spec.md §5 says it is, a copy of the output files.

Guarantees:
- Each message is published at least once while its topic exists and the service answers:
  the client retries what its default retries (aborted, cancelled, deadline exceeded,
  internal, resource exhausted, unavailable, unknown) for up to ``give_up_s``; the bundle waits
  for its messages at its end.
- A message that cannot be published, or is not confirmed within ``give_up_s`` (the topic
  does not exist, permission refused, the service unreachable; the client may still deliver
  one not confirmed in time), is counted (Beam metric ``fanin/pubsub_not_published``) and
  reported: the first failure of a topic at once, later ones at most once a minute, and
  what is left when the run ends (``report_unpublished``, which ``fanin run`` calls before
  its summary), with how many there were. The output files hold it, since the topic is
  their copy; the bundle succeeds and the run goes on (a drain ends as usual).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from typing import Any

import apache_beam as beam
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.pvalue import PCollection, PDone

from fanin.io.counted_report import CountedReport

__all__ = ["PublishLocally", "report_unpublished"]

_LOG = logging.getLogger("fanin")


class _NotPublished(CountedReport):
    """Failed publications of one topic (``CountedReport``); the warning names the last
    error."""

    def __init__(self, topic: str) -> None:
        super().__init__("pubsub_not_published")
        self.topic = topic

    def note(self, error: BaseException) -> None:
        text = str(error).splitlines()[0] if str(error) else ""
        self.count(f"{type(error).__name__}: {text}")

    @staticmethod
    def _fold(earlier: str, detail: str) -> str:
        return detail  # the last error

    def _log(self, total: int, unreported: int, detail: str) -> None:
        _LOG.warning("fanin: %d output(s) not published to %s (%d since the last report; "
                     "last error %s); the output files hold them", total, self.topic,
                     unreported, detail[:300])


class _Topic:
    """One topic's publisher client, retry and failure report, shared by every copy of the
    DoFn in this process: the local runner makes a fresh copy per bundle (set up and torn down
    with it), so a client per copy would be a connection per bundle, and a report per copy
    would repeat itself every bundle."""

    _shared: dict[tuple[str | None, str], _Topic] = {}  # by (emulator address, topic)
    _lock = threading.Lock()

    def __init__(self, topic: str, give_up_s: float) -> None:
        import google.cloud.pubsub_v1 as pubsub_v1
        from google.api_core import exceptions
        from google.api_core.retry import Retry, if_exception_type

        self.client = pubsub_v1.PublisherClient()
        # the errors the publisher's own default retries (its generated client's settings)
        self.retry = Retry(predicate=if_exception_type(
            exceptions.Aborted, exceptions.Cancelled, exceptions.DeadlineExceeded,
            exceptions.InternalServerError, exceptions.ResourceExhausted,
            exceptions.ServiceUnavailable, exceptions.Unknown), timeout=give_up_s)
        self.failed = _NotPublished(topic)

    @classmethod
    def of(cls, topic: str, give_up_s: float) -> _Topic:
        key = (os.environ.get("PUBSUB_EMULATOR_HOST"), topic)
        with cls._lock:
            shared = cls._shared.get(key)
            if shared is None:
                if not cls._shared:
                    atexit.register(cls._at_exit)
                shared = cls._shared[key] = cls(topic, give_up_s)
            return shared

    @classmethod
    def report_all(cls) -> None:
        """Report what each topic has not published yet, and start each count afresh (the
        end of a run)."""
        with cls._lock:
            shared = list(cls._shared.values())
        for topic in shared:
            topic.failed.report(final=True, reset=True)

    @classmethod
    def _at_exit(cls) -> None:
        """The last reports, and the clients stopped."""
        cls.report_all()
        with cls._lock:
            shared = list(cls._shared.values())
        for topic in shared:
            with contextlib.suppress(Exception):  # the service gone
                topic.client.stop()


def report_unpublished() -> None:
    """Log, per output topic of this process, the outputs not published since the last
    report (the run's end: ``fanin run`` calls it before its summary)."""
    _Topic.report_all()


class _PublishFn(beam.DoFn):
    """Publishes a bundle's messages and waits for them at its end (see the module)."""

    def __init__(self, topic: str, give_up_s: float) -> None:
        self._topic = topic
        self._give_up_s = give_up_s
        self._shared: _Topic | None = None
        self._pending: list[Any] = []

    def setup(self) -> None:
        self._shared = _Topic.of(self._topic, self._give_up_s)

    def start_bundle(self) -> None:
        self._pending = []

    def process(self, message: PubsubMessage) -> None:
        if self._shared is None:
            raise RuntimeError("setup() was not called")
        try:
            self._pending.append(self._shared.client.publish(
                self._topic, message.data, retry=self._shared.retry,
                timeout=self._give_up_s, **(message.attributes or {})))
        except Exception as error:  # refused at once (too large with its attributes, ...)
            self._shared.failed.note(error)

    def finish_bundle(self) -> None:
        if self._shared is None:
            raise RuntimeError("setup() was not called")
        failed = self._shared.failed
        ends = time.monotonic() + self._give_up_s
        for future in self._pending:
            try:
                future.result(timeout=max(0.0, ends - time.monotonic()))
            except Exception as error:  # every failure: the files hold it
                failed.note(error)
        self._pending = []
        failed.report()


class PublishLocally(beam.PTransform[PCollection[Any], PDone]):
    """``PubsubMessage`` elements published to ``topic``, never failing the run (see the
    module docstring); the local runner's stand-in for ``WriteToPubSub``."""

    def __init__(self, topic: str, give_up_s: float = 30.0) -> None:
        super().__init__()
        if not give_up_s > 0:
            raise ValueError("give_up_s must be > 0")
        self._topic = topic
        self._give_up_s = give_up_s

    def expand(self, pcoll: PCollection[Any]) -> PDone:
        pcoll | "Publish" >> beam.ParDo(_PublishFn(self._topic, self._give_up_s))
        return PDone(pcoll.pipeline)
