"""Publishing outputs to a Pub/Sub topic on the local runner without failing the run.

On the local runner (BundleBasedDirectRunner) a failed bundle aborts the whole job, and the
messages of its open joins, acknowledged when they were pulled, live only in the process
(docs/reliability.md). Beam's ``WriteToPubSub`` raises when a publish fails (a topic deleted
while the run reads, the service unreachable): one output topic failing lost every message
of the run, its output files included. ``PublishLocally`` publishes instead, and a topic is
what docs/spec.md §5 says it is, a copy of the output files.

Guarantees:
- Each message is published at least once while its topic exists and the service answers:
  the client retries what Pub/Sub calls transient for up to ``give_up_s``; the bundle waits
  for its messages at its end.
- A message that cannot be published, or is not confirmed within ``give_up_s`` (the topic
  does not exist, permission refused, the service unreachable), is counted (Beam metric
  ``fanin/pubsub_not_published``) and reported: the first failure of a topic at once, later
  ones at most once a minute and when the run ends, with how many there were. The output
  files hold it, since the topic is their copy; the bundle succeeds and the run goes on (a
  drain ends as usual).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import apache_beam as beam
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import PCollection, PDone

__all__ = ["PublishLocally"]

_LOG = logging.getLogger("fanin")


class _NotPublished:
    """Failed publications of one topic, reported at once, then at most every ``_EVERY_S``."""

    _EVERY_S = 60.0

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.total = 0
        self._unreported = 0
        self._last = ""
        self._reported_at: float | None = None
        self._counter = Metrics.counter("fanin", "pubsub_not_published")

    def note(self, error: BaseException) -> None:
        self.total += 1
        self._unreported += 1
        self._last = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        self._counter.inc()

    def report(self, final: bool = False) -> None:
        now = time.monotonic()
        if not self._unreported or (not final and self._reported_at is not None
                                    and now - self._reported_at < self._EVERY_S):
            return
        _LOG.warning("fanin: %d output(s) not published to %s (%d since the last report; "
                     "last error %s); the output files hold them", self.total, self.topic,
                     self._unreported, self._last[:300])
        self._unreported = 0
        self._reported_at = now


class _PublishFn(beam.DoFn):
    """Publishes a bundle's messages and waits for them at its end (see the module)."""

    def __init__(self, topic: str, give_up_s: float) -> None:
        self._topic = topic
        self._give_up_s = give_up_s
        self._client: Any = None
        self._pending: list[Any] = []
        self._failed: _NotPublished | None = None

    def setup(self) -> None:
        from google.cloud import pubsub_v1

        self._client = pubsub_v1.PublisherClient()
        self._failed = _NotPublished(self._topic)

    def start_bundle(self) -> None:
        self._pending = []

    def process(self, message: PubsubMessage) -> None:
        from google.api_core.retry import Retry

        self._pending.append(self._client.publish(
            self._topic, message.data, retry=Retry(timeout=self._give_up_s),
            timeout=self._give_up_s, **(message.attributes or {})))

    def finish_bundle(self) -> None:
        if self._failed is None:
            raise RuntimeError("setup() was not called")
        ends = time.monotonic() + self._give_up_s
        for future in self._pending:
            try:
                future.result(timeout=max(0.0, ends - time.monotonic()))
            except Exception as error:  # every failure: the files hold it
                self._failed.note(error)
        self._pending = []
        self._failed.report()

    def teardown(self) -> None:
        if self._failed is not None:
            self._failed.report(final=True)
        if self._client is not None:
            with contextlib.suppress(Exception):  # stopped already, or the service gone
                self._client.stop()


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
