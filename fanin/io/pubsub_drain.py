"""Draining a streaming run on Beam's local runner: a Pub/Sub read that stops on request.

Why a drain. Beam 2.77's local streaming runner (``BundleBasedDirectRunner``) reads Pub/Sub in
``_PubSubReadEvaluator``: each read pulls up to 10 messages and **acknowledges them at once**,
before any downstream step has seen them (``runners/direct/transform_evaluator.py``: "Because
of the AutoAck, we are not able to reread messages"). Join state lives in that process's
memory. So once a message is read, the only place its effect exists is the running process;
interrupting it (the old ``KeyboardInterrupt``) lost every message of every open join. Holding
acknowledgements back until a join's close is written is not possible on that runner (the ack
is inside the runner, and a join may stay open longer than Pub/Sub's 600 s ack deadline limit).

What this module does instead, like Dataflow's drain: ``Drain.request()`` (called by
``run_pipeline``'s SIGINT/SIGTERM handler) makes the read stop pulling and report itself
finished. Beam then advances the watermark to the end of time, so every event-time timer fires:
each open join closes (``timeout``/``partial`` as at its deadline), windowed writes flush, and
``wait_until_finish()`` returns. Every acknowledged message is in the outputs; every message not
yet pulled stays in the subscription for the next run.

Guarantees of ``DrainableLocalRead``:
- Reads the same messages as ``ReadFromPubSub`` (``with_attributes=True``, publish-time
  timestamps), acknowledging each batch when pulled (Beam's behaviour, unchanged).
- After ``request()``, no further pull starts; a pull already in flight completes and its
  messages are processed. An idle read polls every 0.2 s (rather than Beam's 30 s long poll), so
  a stop takes effect within about that time plus the pipeline's flush.
- A hard kill (SIGKILL, power loss) still loses the open joins' messages: that is the local
  runner's limit; Dataflow keeps state durably and acknowledges only after it is committed.

Relies on two internals of Beam's direct runner (checked in ``tests/io/test_pubsub_stop.py``):
``_PubSubReadEvaluator`` and ``TransformEvaluatorRegistry._test_evaluators_overrides``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from typing import Any, cast

from apache_beam.io.gcp.pubsub import ReadFromPubSub
from apache_beam.pvalue import PBegin, PCollection
from apache_beam.runners.direct.direct_runner import _DirectReadFromPubSub
from apache_beam.runners.direct.transform_evaluator import (
    TransformEvaluatorRegistry,
    _PubSubReadEvaluator,
)
from apache_beam.runners.direct.util import TransformResult
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP

__all__ = ["Drain", "DrainableLocalRead", "drain_on_signals"]

# How long an idle read waits (for a message or a drain) before pulling again.
_IDLE_WAIT_S = 0.2
# How long a read waits after a failed pull before trying again.
_RETRY_WAIT_S = 1.0
# Messages per pull, so per bundle (Beam's evaluator asks for 10: each bundle then pays the
# local runner's per-bundle cost through every step for 10 messages).
_MAX_PULL = 500
# Longest a single pull may take (it returns at once unless the service is unreachable).
_PULL_TIMEOUT_S = 10.0
_LOG = logging.getLogger("fanin")
# The last instant of the global window: a drained read holds its watermark there first.
_END = GlobalWindow().max_timestamp()
# Consecutive quiescent checks (each _IDLE_WAIT_S / 2 apart) before the hold is released.
_SETTLED_CHECKS = 5

_DRAINS: weakref.WeakValueDictionary[str, Drain] = weakref.WeakValueDictionary()


def _drain_by_token(token: str) -> Drain:
    drain = _DRAINS.get(token)
    if drain is None:  # unpickled in another process: a drain nobody can request
        drain = Drain(token)
    return drain


class Drain:
    """A stop request shared by the reads of one run.

    Pickles by identity within the process (Beam round-trips the pipeline through its runner
    API before running it locally): the unpickled object is this same ``Drain``.
    """

    def __init__(self, token: str | None = None) -> None:
        self.token = token or uuid.uuid4().hex
        self._event = threading.Event()
        self._settled = 0
        self.outage: str | None = None  # the error of the read's failing pulls, if failing
        self._acknowledged = 0
        self._lock = threading.Lock()
        _DRAINS[self.token] = self

    def acknowledge(self, count: int) -> None:
        """Count ``count`` messages the read acknowledged (they cannot be read again)."""
        with self._lock:
            self._acknowledged += count

    @property
    def acknowledged(self) -> int:
        """The messages the read acknowledged so far."""
        return self._acknowledged

    def request(self) -> None:
        """Stop reading: no new pull starts; what was read is processed and written."""
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def settle(self, quiescent: bool) -> int:
        """Record one check of the drained pipeline; the number of quiescent checks in a row."""
        self._settled = self._settled + 1 if quiescent else 0
        return self._settled

    def wait(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` or until requested; returns whether it was requested."""
        return self._event.wait(timeout_s)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return _drain_by_token, (self.token,)


class DrainableLocalRead(_DirectReadFromPubSub):
    """The direct runner's native Pub/Sub read, stoppable by ``drain``.

    Takes the same arguments as ``ReadFromPubSub`` (always ``with_attributes=True``), plus the
    ``Drain``. Only for Beam's local runners; ``fanin.io.pubsub.ReadMessages`` picks it there.
    """

    def __init__(self, drain: Drain, subscription: str | None = None,
                 topic: str | None = None) -> None:
        # Beam's private read, unannotated
        super().__init__(ReadFromPubSub(  # type: ignore[no-untyped-call]
            subscription=subscription, topic=topic, with_attributes=True)._source)
        self.drain = drain

    def expand(self, pbegin: PBegin) -> PCollection[Any]:
        return PCollection(pbegin.pipeline, is_bounded=False)


@functools.lru_cache(maxsize=4)
def _emulator_subscriber(host: str) -> Any:
    """A subscriber client for the emulator at ``host`` on a channel without gRPC's 4 MiB
    receive limit. The client library's emulator channel keeps that default (its channel for
    the service has none), so a pull of more than 4 MiB of messages, or one message over it
    (Pub/Sub takes up to 10 MB), failed on every retry and the read stalled for good."""
    import google.cloud.pubsub_v1 as pubsub_v1
    import grpc
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

    channel = grpc.insecure_channel(host, options=[("grpc.max_receive_message_length", -1),
                                                   ("grpc.max_send_message_length", -1)])
    return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))


class _IdlePollingClient:
    """A subscriber client for the read: ``pull`` asks for up to 500 messages (Beam asks for
    10), returns at once and, when nothing came, waits up to 0.2 s (returning early on a drain
    request) instead of holding the pull open for 30 s.

    Outages: a pull or acknowledge that fails (service unreachable, subscription gone) does not
    fail the job. The first failure is logged as a warning, pulls are retried every second, and
    the recovery is logged; a Ctrl-C meanwhile drains as usual. A failed acknowledge means the
    service may deliver those messages again: they are processed now, and again on redelivery,
    where the join counts them as duplicates (or late, after its close).
    """

    def __init__(self, client: Any, drain: Drain) -> None:
        self._client = client
        self._drain = drain

    def pull(self, subscription: str, max_messages: int, timeout: float) -> Any:
        from google.api_core.exceptions import GoogleAPIError
        from google.cloud.pubsub_v1.types import PullResponse

        try:
            # No client retries: an outage shows at once (logged) and this loop retries.
            response = self._client.pull(subscription=subscription,
                                         max_messages=max(max_messages, _MAX_PULL),
                                         return_immediately=True, retry=None,
                                         timeout=min(timeout, _PULL_TIMEOUT_S))
        except GoogleAPIError as error:
            if self._drain.outage != type(error).__name__:  # the first failure, or another
                _LOG.warning("fanin: pulling %s %s (%s: %s); retrying every %g s until it "
                             "answers (Ctrl-C drains the run)", subscription,
                             "failed" if self._drain.outage is None else "now fails",
                             type(error).__name__, str(error).splitlines()[0][:200],
                             _RETRY_WAIT_S)
            self._drain.outage = type(error).__name__
            self._drain.wait(_RETRY_WAIT_S)
            return PullResponse()
        if self._drain.outage is not None:
            _LOG.warning("fanin: pulling %s works again after %s", subscription,
                         self._drain.outage)
            self._drain.outage = None
        if not response.received_messages:
            self._drain.wait(_IDLE_WAIT_S)
        return response

    def acknowledge(self, subscription: str, ack_ids: list[str]) -> None:
        from google.api_core.exceptions import GoogleAPIError

        try:
            self._client.acknowledge(subscription=subscription, ack_ids=ack_ids)
            self._drain.acknowledge(len(ack_ids))
        except GoogleAPIError as error:
            _LOG.warning("fanin: acknowledging %d message(s) of %s failed (%s); Pub/Sub may "
                         "deliver them again, counted then as duplicates", len(ack_ids),
                         subscription, type(error).__name__)


class _DrainableReadEvaluator(_PubSubReadEvaluator):
    """``_PubSubReadEvaluator`` that, once drained, pulls nothing more and finishes in two steps.

    1. The source's watermark is held at the global window's last instant (``_END``), so every
       event-time timer of the join (all set at or before it) fires while the output writes
       can still take what they emit.
    2. Once the rest of the pipeline is quiescent there (every step's input watermark at
       ``_END``, no pending bundle, no fired timer in progress) on ``_SETTLED_CHECKS`` checks
       in a row, the hold is released: no residual bundle, so the watermark reaches the end of
       time, the writes fire their last panes and the pipeline finishes.

    Step 2 waits because Beam's direct runner does not hold a stateful step's output watermark
    for its pending timers: releasing at once would let the writes' global window expire
    before the joins' deadline closes reach them (they would be dropped).
    """

    def _get_subscriber_client(self, transform: Any) -> Any:  # type: ignore[override]
        client = super()._get_subscriber_client(transform)  # type: ignore[no-untyped-call]
        host = os.environ.get("PUBSUB_EMULATOR_HOST")
        return _IdlePollingClient(_emulator_subscriber(host) if host else client,
                                  transform.transform.drain)

    def _read(self) -> DrainableLocalRead:
        """The read this evaluator runs (the registry maps only ``DrainableLocalRead`` here)."""
        return cast(DrainableLocalRead, self._applied_ptransform.transform)

    def _quiescent(self) -> bool:
        """No bundle pending, no fired timer in progress, and every step's input watermark at
        ``_END`` or at a hold of a step that keeps elements for its last pane (the writes'
        grouping, which fires when the watermark reaches the end of time)."""
        manager = self._evaluation_context._watermark_manager
        others = [watermarks for transform, watermarks in manager._transform_to_watermarks.items()
                  if transform is not self._applied_ptransform]
        holds = [hold for w in others for hold in w._keyed_earliest_holds.values()]
        floor = min([_END, *holds])
        return all(w.input_watermark >= floor and not w._pending and not w._fired_timers
                   for w in others)

    _backlog: Any = None  # the least timestamp of the last pull, None when it was empty

    def _read_from_pubsub(self, timestamp_attribute: Any) -> Any:
        data = super()._read_from_pubsub(timestamp_attribute)
        self._backlog = min(t for t, _ in data) if data else None
        return data

    def finish_bundle(self) -> TransformResult:
        """Beam's read sets the watermark to the wall clock after every pull, so a backlog (a
        run started after messages were published, or one that fell behind) was decided
        against the clock: a join's deadline timer fired between pulls, before its messages
        still waiting in the subscription were read. While pulls bring messages, the watermark
        stays at the least timestamp of the last pull instead (at most the clock), as
        Dataflow's Pub/Sub watermark follows the oldest unacknowledged message; once a pull
        comes back empty (nothing waits), it is the clock's again. (A pull brings at most 100
        messages from the emulator, whatever it asks for.)"""
        drain = self._read().drain
        if not drain.requested:
            result = super().finish_bundle()
            if self._backlog is None:
                return result
            clock = result.keyed_watermark_holds[None]
            return TransformResult(self, result.uncommitted_output_bundles,
                                   result.unprocessed_bundles, None,
                                   {None: min(clock, self._backlog)})
        if drain.settle(self._quiescent()) >= _SETTLED_CHECKS:
            return TransformResult(self, [], [], None, {None: MAX_TIMESTAMP})
        time.sleep(_IDLE_WAIT_S / 2)  # let the timers fire before the next check
        # as Beam's own read evaluators make theirs; the runner's copy of the read may have
        # no pipeline set (None), which the residual bundle does not need
        residual = self._evaluation_context.create_bundle(
            PBegin(cast(Any, self._read().pipeline)))
        return TransformResult(self, [], [residual], None, {None: _END})


TransformEvaluatorRegistry._test_evaluators_overrides[DrainableLocalRead] = (
    _DrainableReadEvaluator)


@contextlib.contextmanager
def drain_on_signals(drain: Drain, log: logging.Logger) -> Iterator[None]:
    """While inside, the first SIGINT, SIGTERM or SIGHUP (the terminal closed: it killed the
    run, its acknowledged messages unwritten) requests ``drain`` (logged, one line); a second
    one aborts: one line logged and ``SystemExit(130)`` (the joins still open are lost; no
    traceback). SIGHUP is left alone when ignored (``nohup``). Handlers are installed only in
    the main thread and restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, _frame: Any) -> None:
        if drain.requested:
            log.error("fanin: %s again: aborted; joins still open were not written",
                      signal.Signals(signum).name)
            raise SystemExit(130)
        drain.request()
        log.warning("fanin: %s: draining: reading stopped; open joins close as at their "
                    "deadline and every output is written before exit (signal again to abort "
                    "and lose them)", signal.Signals(signum).name)

    signals = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signals.append(signal.SIGHUP)
    previous = {sig: signal.signal(sig, handle) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
