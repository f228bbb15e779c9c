"""Pub/Sub input and output for Fanin pipelines, and a file publisher for feeding a topic.

- ``ReadMessages``: a streaming source of ``(data, source)`` pairs, one per Pub/Sub message.
- ``PublishJson``: a sink that publishes dicts (closes, late records...) as compact JSON.
- The file publisher of ``fanin publish`` is ``fanin.io.publish``.

Element timestamps. ``ReadMessages`` does not hand ``timestamp_attribute`` to
``ReadFromPubSub``: on Beam 2.77's local runner a message whose attribute is neither epoch
milliseconds nor RFC 3339 makes the read evaluator raise ``ValueError('Bad timestamp value:
...')`` before the pulled batch is acknowledged. Observed: the runner logs "Exception at
bundle", keeps running, the whole batch (up to 10 messages) is redelivered after each ack
deadline and fails again, and ``wait_until_finish()`` neither returns nor raises (a poison
message that stalls the source). Instead this transform reads with attributes and stamps each
element itself: the attribute's time if it parses (epoch milliseconds, or RFC 3339 truncated to
milliseconds, years 0001-9999), otherwise the publish time (the timestamp the source assigns when
it has no timestamp attribute). Consequence on every runner: the source's watermark follows
publish time, not the attribute, so messages whose event time is older than their publish time
arrive behind the watermark; Fanin's stateful join in the global window handles such messages
itself (docs/spec.md §4), and nothing is dropped by this transform.
"""

from __future__ import annotations

import calendar
import datetime
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.gcp.pubsub import (
    PubsubMessage,
    ReadFromPubSub,
    WriteToPubSub,
)
from apache_beam.pvalue import PBegin, PCollection, PDone
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from fanin.contracts.parsing import read_join_id
from fanin.contracts.timefmt import MAX_MS, MIN_MS, format_ms, parse_rfc3339
from fanin.core.outcomes import encode_line
from fanin.io.counted_report import CountedReport
from fanin.io.credentials import unreadable_credentials
from fanin.io.pubsub_drain import Drain, DrainableLocalRead
from fanin.io.pubsub_publish import PublishLocally

__all__ = [
    "PublishJson",
    "ReadMessages",
    "check_pubsub_resources",
    "parse_event_time_ms",
    "validate_pubsub_path",
    "validate_topic_path",
]

_LOG = logging.getLogger("fanin")
_EPOCH_MILLIS = re.compile(r"-?[0-9]{1,18}\Z")  # ASCII digits only (int() reads others)
# What the Pub/Sub service accepts (its resource-name rules; the emulator is more lenient).
_PROJECT_ID = re.compile(r"([a-z][-a-z0-9.]{0,61}[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]\Z")
_RESOURCE_NAME = re.compile(r"[A-Za-z][-A-Za-z0-9_.~+%]{2,254}\Z")
_KINDS = {"topics": "topic", "subscriptions": "subscription"}


def validate_pubsub_path(path: str, collection: str) -> str:
    """Return ``path`` if the Pub/Sub service accepts it as ``projects/PROJECT/<collection>/NAME``
    (``collection``: ``topics`` or ``subscriptions``); else raise ``ValueError`` whose one-line
    message says which part is wrong and the rule it breaks: a project id is 6-30 lowercase
    letters, digits or hyphens, starting with a letter and not ending with a hyphen (optionally
    ``domain:`` first); a name is 3-255 letters, digits or ``-_.~+%``, starting with a letter,
    not starting with ``goog``. Checked before running, since the emulator accepts project ids
    the service refuses (a job tried on the emulator would then fail on the service)."""
    kind = _KINDS[collection]
    parts = path.split("/")
    if len(parts) != 4 or parts[0] != "projects" or parts[2] != collection:
        raise ValueError(f"{kind} {path!r} is not of the form projects/PROJECT/{collection}/NAME")
    project, name = parts[1], parts[3]
    if not _PROJECT_ID.match(project):
        raise ValueError(f"{kind} {path!r}: project id {project!r} is refused by Pub/Sub: it "
                         "needs 6-30 lowercase letters, digits or hyphens, starting with a "
                         "letter and not ending with a hyphen (e.g. my-project)")
    if not _RESOURCE_NAME.match(name) or name.lower().startswith("goog"):
        raise ValueError(f"{kind} {path!r}: name {name!r} is refused by Pub/Sub: it needs "
                         "3-255 letters, digits or -_.~+%, starting with a letter (not 'goog')")
    return path


def validate_topic_path(topic: str) -> str:
    """``validate_pubsub_path(topic, "topics")``."""
    return validate_pubsub_path(topic, "topics")


_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})\Z")


def check_emulator_host() -> None:
    """``PUBSUB_EMULATOR_HOST``, when set, is ``HOST:PORT`` (port 1-65535): else
    ``ValueError`` naming it (the client took any text and waited, then failed every
    message)."""
    host = os.environ.get("PUBSUB_EMULATOR_HOST")
    if not host:  # unset, or empty: Pub/Sub itself, as the client reads it
        return
    match = _HOST_PORT.match(host)
    if match is None or not 0 < int(match.group(1)) < 65536:
        raise ValueError(f"PUBSUB_EMULATOR_HOST={host!r}: give HOST:PORT (such as "
                         "localhost:8085), or unset it to use Pub/Sub")


def check_pubsub_resources(subscription: str | None = None, topics: Sequence[str] = (),
                           timeout_s: float = 30.0) -> None:
    """Ask Pub/Sub (or the emulator at ``PUBSUB_EMULATOR_HOST``) whether ``subscription`` and
    each of ``topics`` exist, before a run starts reading or publishing. Raises ``ValueError``
    with one line: the resource that does not exist, that the service did not answer within
    ``timeout_s`` (retries included; and where it was asked), or that there are no
    credentials to ask with, or credentials it refuses. Credentials allowed to publish or pull
    but not to look a resource up (``PermissionDenied``) get a warning, and the run goes on."""
    import google.cloud.pubsub_v1 as pubsub_v1
    from google.api_core import exceptions, retry
    from google.auth.exceptions import DefaultCredentialsError

    check_emulator_host()
    where = os.environ.get("PUBSUB_EMULATOR_HOST") or "pubsub.googleapis.com"
    asks = [("subscription", s) for s in (subscription,) if s] + [("topic", t) for t in topics]
    if not asks:
        return
    try:
        subscriber = pubsub_v1.SubscriberClient()
        publisher = pubsub_v1.PublisherClient()
    except DefaultCredentialsError:
        raise ValueError("no Google credentials to reach Pub/Sub: set "
                         "PUBSUB_EMULATOR_HOST=HOST:PORT to use the Pub/Sub emulator, or set "
                         "up Application Default Credentials") from None
    except OSError as error:
        raise unreadable_credentials(error) from None
    # the client's own retry rule for these calls, within timeout_s (its deadline took ~51 s)
    within = retry.Retry(initial=0.1, maximum=60.0, multiplier=1.3, timeout=timeout_s,
                         predicate=retry.if_exception_type(
                             exceptions.Aborted, exceptions.ServiceUnavailable,
                             exceptions.Unknown))
    try:
        for kind, path in asks:
            try:
                if kind == "subscription":
                    subscriber.get_subscription(subscription=path, timeout=timeout_s,
                                                retry=within)
                else:
                    publisher.get_topic(topic=path, timeout=timeout_s, retry=within)
            except exceptions.NotFound:
                raise ValueError(f"{kind} {path} does not exist (asked {where}); create it "
                                 "first") from None
            except (exceptions.RetryError, exceptions.DeadlineExceeded,
                    exceptions.ServiceUnavailable, exceptions.Aborted,
                    exceptions.Unknown) as error:
                raise ValueError(f"Pub/Sub at {where} did not answer about {kind} {path} "
                                 f"within {timeout_s:g} s ({type(error).__name__})") from None
            except exceptions.PermissionDenied:  # e.g. roles/pubsub.publisher: no *.get
                _LOG.warning("fanin: these credentials may not check that %s %s exists "
                             "(PermissionDenied on get); going on", kind, path)
            except exceptions.Unauthenticated as error:
                raise ValueError(f"Pub/Sub at {where} refused these credentials for {kind} "
                                 f"{path} ({type(error).__name__})") from None
    finally:
        subscriber.close()
        publisher.transport.close()


def parse_event_time_ms(value: str | None) -> int | None:
    """Epoch milliseconds of a timestamp attribute, or ``None`` if absent or unparseable.

    Accepts what ``ReadFromPubSub``'s ``timestamp_attribute`` accepts: an integer number of epoch
    milliseconds, or RFC 3339 (truncated to whole milliseconds). Instants outside years
    0001-9999 count as unparseable. Never raises.
    """
    if value is None:
        return None
    if _EPOCH_MILLIS.match(value):
        millis = int(value)
        return millis if MIN_MS <= millis <= MAX_MS else None
    try:
        return parse_rfc3339(value)
    except ValueError:
        return None


def _publish_time_rfc3339(publish_time: datetime.datetime | None) -> str | None:
    if publish_time is None:
        return None
    if publish_time.tzinfo is None:
        publish_time = publish_time.replace(tzinfo=datetime.timezone.utc)
    seconds = calendar.timegm(publish_time.utctimetuple())
    return format_ms(seconds * 1000 + publish_time.microsecond // 1000)


_SHARED_LOCK = threading.Lock()


class _StaleReport(CountedReport):
    """Messages whose event time is older than ``stale_after_ms`` before the clock
    (``CountedReport``: one warning with counts, at the end of the first bundle that had any,
    then at most once a minute while more arrive, and at the run's end for those not reported
    yet, ``report_stale``); the warning gives the oldest event time. Their joins' tombstones
    (deadline + retention) are gone by the time they arrive, so each such message starts a
    join afresh: replayed history sent to a live subscription closes the same joins again and
    again.

    One report per reading step and process (``shared``): the local runner runs each bundle
    with a fresh copy of the step's DoFn, on several threads."""

    _SHARED: dict[str, _StaleReport] = {}  # by the token of the DoFn whose copies share it

    def __init__(self, stale_after_ms: int) -> None:
        super().__init__("pubsub_older_than_retention")
        self.stale_after_ms = stale_after_ms

    @classmethod
    def shared(cls, token: str, stale_after_ms: int) -> _StaleReport:
        """The report of the step ``token`` names, in this process."""
        with _SHARED_LOCK:
            report = cls._SHARED.get(token)
            if report is None:
                report = cls._SHARED[token] = cls(stale_after_ms)
            return report

    @classmethod
    def report_all(cls) -> None:
        """Report what every report of this process holds unreported, and forget them."""
        with _SHARED_LOCK:
            reports = list(cls._SHARED.values())
            cls._SHARED.clear()
        for report in reports:
            report.report(final=True)

    def note(self, event_ms: int) -> None:
        if event_ms < time.time() * 1000 - self.stale_after_ms:
            self.count(event_ms)

    @staticmethod
    def _fold(earlier: int, detail: int) -> int:
        return min(earlier, detail)  # the oldest event time

    def _log(self, total: int, unreported: int, detail: int) -> None:
        _LOG.warning(
            "fanin: %d Pub/Sub message(s) (%d since the last report; oldest event time %s) are "
            "older than the longest deadline + tombstone retention (%g s): their joins start "
            "afresh and may close again. Replaying history? Use fanin run --input for files, "
            "or fanin simulate --start now --rate N/s for live traffic",
            total, unreported, format_ms(detail), self.stale_after_ms / 1000)


def report_stale() -> None:
    """Log the messages older than the retention that the Pub/Sub reads of this process counted
    and have not reported yet (the run's end: ``fanin run`` calls it before its summary)."""
    _StaleReport.report_all()


class _ToRecord(beam.DoFn):
    """PubsubMessage -> (data, source), re-stamped from the timestamp attribute when valid;
    messages older than ``stale_after_ms`` are reported (``_StaleReport``)."""

    def __init__(self, source_kind: str, source_name: str, timestamp_attribute: str | None,
                 stale_after_ms: int | None = None):
        self._source_kind = source_kind
        self._source_name = source_name
        self._timestamp_attribute = timestamp_attribute
        self._stale_after_ms = stale_after_ms
        self._token = uuid.uuid4().hex  # copies of this DoFn share one report (_StaleReport)
        self._stale: _StaleReport | None = None

    def setup(self) -> None:
        if self._stale_after_ms is not None:
            self._stale = _StaleReport.shared(self._token, self._stale_after_ms)

    def process(self, message: PubsubMessage) -> Iterator[Any]:
        attributes = dict(message.attributes or {})
        source = {
            "kind": "pubsub",
            self._source_kind: self._source_name,
            "message_id": message.message_id or None,
            "publish_time": _publish_time_rfc3339(message.publish_time),
            "attributes": attributes,
        }
        record = (message.data or b"", source)
        event_ms = (
            parse_event_time_ms(attributes.get(self._timestamp_attribute))
            if self._timestamp_attribute
            else None
        )
        if event_ms is None:
            # Keep the source's timestamp: the publish time.
            yield record
        else:
            if self._stale is not None:
                self._stale.note(event_ms)
            yield TimestampedValue(record, Timestamp(micros=event_ms * 1000))

    def finish_bundle(self) -> None:
        if self._stale is not None:
            self._stale.report()


def _on_dataflow(pipeline: beam.Pipeline) -> bool:
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    return isinstance(pipeline.runner, DataflowRunner)


def _on_local_direct_runner(pipeline: beam.Pipeline) -> bool:
    from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner, DirectRunner

    return isinstance(pipeline.runner, (BundleBasedDirectRunner, DirectRunner))


class ReadMessages(beam.PTransform[PBegin, PCollection[Any]]):
    """Read Pub/Sub messages as ``(data: bytes, source: dict)`` pairs (streaming only).

    Exactly one of ``subscription`` (``projects/P/subscriptions/S``) or ``topic``
    (``projects/P/topics/T``; the runner then creates a temporary subscription, so only messages
    published after the pipeline starts are read) must be given; otherwise, or for a malformed
    path, the constructor raises ``ValueError``.

    ``source`` is ``{"kind": "pubsub", "subscription" | "topic": <path>, "message_id": str | None,
    "publish_time": RFC 3339 UTC with milliseconds | None, "attributes": {str: str}}``.

    Timestamps: an element is stamped with its ``timestamp_attribute`` (default ``event_time``)
    when that attribute holds epoch milliseconds or RFC 3339, else with its publish time; a
    missing or bad attribute never fails the pipeline (see the module docstring for why this is
    not delegated to ``ReadFromPubSub``). ``timestamp_attribute=None`` always uses publish time.

    Deduplication: Pub/Sub delivers at least once. ``id_label`` (an attribute carrying a
    publisher-chosen unique id) is passed to ``ReadFromPubSub`` only when the pipeline runs on
    Dataflow, whose source then drops redeliveries; Beam's local runners do not implement it, so
    on any other runner ``id_label`` raises ``NotImplementedError`` when the transform is applied
    rather than silently not deduplicating. Without it, duplicates reach the join, whose reducer
    counts identical receipts as duplicates (docs/spec.md §3).

    Stopping: on Beam's local direct runner the read is ``fanin.io.pubsub_drain``'s
    ``DrainableLocalRead``; ``drain.request()`` (``drain`` given here, or the one created and
    exposed as ``self.drain``) stops pulling and lets every open join close and be written, as
    a Dataflow drain does. On other runners ``drain`` is unused (drain the job with the runner).

    ``stale_after_ms``: messages whose timestamp attribute is older than this before the clock
    are counted (metric ``fanin/pubsub_older_than_retention``) and reported in one warning
    with counts (repeated at most once a minute while more arrive); ``fanin run`` passes the
    longest deadline + tombstone retention of its contracts and defaults.
    """

    def __init__(
        self,
        subscription: str | None = None,
        topic: str | None = None,
        timestamp_attribute: str | None = "event_time",
        id_label: str | None = None,
        drain: Drain | None = None,
        stale_after_ms: int | None = None,
    ) -> None:
        super().__init__()
        if (subscription is None) == (topic is None):
            raise ValueError("ReadMessages needs exactly one of subscription= or topic=")
        # what the read names in each message's source: ("subscription" | "topic", its path)
        self._source: tuple[str, str]
        if subscription is not None:
            self._source = "subscription", validate_pubsub_path(subscription, "subscriptions")
        elif topic is not None:
            self._source = "topic", validate_pubsub_path(topic, "topics")
        self._subscription = subscription
        self._topic = topic
        self._timestamp_attribute = timestamp_attribute
        self._id_label = id_label
        self.drain = drain or Drain()
        self._stale_after_ms = stale_after_ms

    def expand(self, pbegin: PBegin) -> PCollection[Any]:
        if self._id_label is not None and not _on_dataflow(pbegin.pipeline):
            raise NotImplementedError(
                f"ReadMessages(id_label={self._id_label!r}) needs the Dataflow runner; "
                f"{type(pbegin.pipeline.runner).__name__} does not deduplicate by id_label. "
                "Drop id_label: the join's reducer counts redelivered receipts as duplicates."
            )
        kind, name = self._source
        if kind == "topic":
            _LOG.warning("fanin: reading %s through a subscription made for this run and "
                         "deleted when it ends: messages published while no run reads it "
                         "(before this one starts, after it stops) or not yet pulled when it "
                         "stops are not received; read a subscription (--subscription) to "
                         "lose none", name)
        if _on_local_direct_runner(pbegin.pipeline):
            read: beam.PTransform[PBegin, PCollection[Any]] = DrainableLocalRead(
                self.drain, self._subscription, self._topic)
        else:
            read = ReadFromPubSub(subscription=self._subscription, topic=self._topic,
                                  id_label=self._id_label, with_attributes=True)
        return (
            pbegin
            | "ReadFromPubSub" >> read
            | "ToRecord"
            >> beam.ParDo(_ToRecord(kind, name, self._timestamp_attribute,
                                    self._stale_after_ms)).with_output_types(
                tuple[bytes, dict[str, Any]]
            )
        )


_MARKER_FIELDS = ("join_id", "reason", "error")  # short fields a marker keeps (by kind)


def _default_attributes(obj: Mapping[str, Any]) -> dict[str, str]:
    """``join_id``: the object's (closes, late lines), or a dead letter's message's when that
    is a JSON object with a join_id string (``read_join_id``); none otherwise."""
    join_id = obj.get("join_id")
    if join_id is None and isinstance(obj.get("raw"), str):  # whatever its size (too_large)
        join_id = read_join_id(obj["raw"], max_bytes=sys.maxsize)
    return {"join_id": join_id} if isinstance(join_id, str) and join_id else {}


# Pub/Sub takes at most 10,000,000 bytes a message (data, attributes and framing)
MAX_TOPIC_DATA = 9_900_000


def _to_pubsub_message(
    obj: Mapping[str, Any],
    attributes_fn: Callable[[Mapping[str, Any]], Mapping[str, str]] | None,
) -> PubsubMessage:
    data = encode_line(dict(obj)).encode("utf-8")
    if len(data) > MAX_TOPIC_DATA:  # the files hold it whole; the topic gets a marker
        _LOG.warning("fanin: an output of %d bytes is over Pub/Sub's message limit; its topic "
                     "gets a too_large_for_pubsub marker, the output files hold it whole",
                     len(data))
        data = encode_line({**{k: obj[k] for k in _MARKER_FIELDS if k in obj},
                            "too_large_for_pubsub": len(data)}).encode("utf-8")
    attributes = _default_attributes(obj)
    if attributes_fn is not None:
        attributes.update(attributes_fn(obj))
    for key, value in attributes.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"Pub/Sub attributes must be str -> str, got {key!r}: {value!r}")
    return PubsubMessage(data, attributes)


class PublishJson(beam.PTransform[PCollection[Any], PDone]):
    """Publish each input dict to ``topic`` as one compact JSON message.

    Data: the same compact UTF-8 JSON as the output files (``fanin.core.outcomes.encode_line``);
    an object whose line is over ``MAX_TOPIC_DATA`` bytes (Pub/Sub refuses it, and the run
    failed) is published as a marker ``{"join_id", "reason" or "error" as the object has them,
    "too_large_for_pubsub": its size in bytes}``; the output files always hold it whole.
    Attributes: ``join_id`` when the dict has a non-empty string ``join_id``, updated with
    ``attributes_fn(obj)`` if given; a non-str attribute key or value raises ``TypeError``.
    Writing uses ``WriteToPubSub(with_attributes=True)``, which publishes and waits for each
    bundle's messages at the end of the bundle (at least once: a retried bundle publishes
    again); on the local runner ``PublishLocally`` (``fanin.io.pubsub_publish``), which does
    the same and never fails the run: what it cannot publish is counted and logged, and the
    output files hold it.
    """

    def __init__(
        self,
        topic: str,
        attributes_fn: Callable[[Mapping[str, Any]], Mapping[str, str]] | None = None,
    ) -> None:
        super().__init__()
        validate_topic_path(topic)
        self._topic = topic
        self._attributes_fn = attributes_fn

    def expand(self, pcoll: PCollection[Any]) -> PDone:
        attributes_fn = self._attributes_fn
        return (
            pcoll
            | "ToPubsubMessage"
            >> beam.Map(_to_pubsub_message, attributes_fn).with_output_types(PubsubMessage)
            | "WriteToPubSub" >> (
                PublishLocally(self._topic) if _on_local_direct_runner(pcoll.pipeline)
                else WriteToPubSub(self._topic, with_attributes=True))
        )
