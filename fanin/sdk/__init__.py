"""Emitter SDK for agent code: join contexts, opens, receipts and sinks (docs/spec.md §1).

Typical use::

    from fanin.sdk import Emitter, JoinContext, JsonlFileSink

    with Emitter(JsonlFileSink("receipts.jsonl")) as emitter:   # closes (flushes) on exit
        ctx = JoinContext.new(contract="triage", run_id="run-1")
        emitter.open(ctx)

        @emitter.branch(ctx, "retrieve")
        def retrieve() -> list[str]:
            return ["doc-1", "doc-2"]

        retrieve()
        with emitter.receipt(ctx, "rank", key="score") as r:
            r.value = 0.93
        emitter.skip(ctx, "enrich")

See ``fanin.sdk.emitter`` for the guarantees (one receipt per run, attempts across processes,
timeouts, what is refused) and ``fanin.sdk.sinks`` for delivery (flush deadlines, bounds, exit).
"""

from fanin.sdk.context import Clock, ClockError, JoinContext, now_rfc3339
from fanin.sdk.emitter import (
    DEFAULT_MAX_BYTES,
    AttemptSource,
    ContextSource,
    Emitter,
    Receipt,
)
from fanin.sdk.messages import (
    ERROR_TEXT_LIMIT,
    STATUSES,
    MessageRefused,
    Status,
    encode_message,
    fit_error,
    open_message,
    receipt_message,
)
from fanin.sdk.sinks import (
    EncodedMessage,
    JsonlFileSink,
    MemorySink,
    NotDurableError,
    PublishError,
    PubSubSink,
    Sink,
    UnflushedMessagesWarning,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "ERROR_TEXT_LIMIT",
    "STATUSES",
    "AttemptSource",
    "Clock",
    "ClockError",
    "ContextSource",
    "Emitter",
    "EncodedMessage",
    "JoinContext",
    "JsonlFileSink",
    "MemorySink",
    "MessageRefused",
    "NotDurableError",
    "PubSubSink",
    "PublishError",
    "Receipt",
    "Sink",
    "Status",
    "UnflushedMessagesWarning",
    "encode_message",
    "fit_error",
    "now_rfc3339",
    "open_message",
    "receipt_message",
]
