"""Emitter SDK for agent code: join contexts, opens, receipts and sinks (SPEC §1).

Typical use::

    from fanin.sdk import Emitter, JoinContext, JsonlFileSink

    emitter = Emitter(JsonlFileSink("receipts.jsonl"))
    ctx = JoinContext.new(contract="triage", run_id="run-1")
    emitter.open(ctx)

    @emitter.branch(ctx, "retrieve")
    def retrieve() -> list[str]:
        return ["doc-1", "doc-2"]

    with emitter.receipt(ctx, "rank", key="score") as r:
        r.value = 0.93
    emitter.skip(ctx, "enrich")
    emitter.close()

See ``fanin.sdk.emitter`` for the guarantees (one receipt per run, attempts, timeouts).
"""

from fanin.sdk.context import Clock, JoinContext, now_rfc3339
from fanin.sdk.emitter import DEFAULT_MAX_BYTES, ContextSource, Emitter, Receipt
from fanin.sdk.messages import STATUSES, Status, encode_message, open_message, receipt_message
from fanin.sdk.sinks import (
    EncodedMessage,
    JsonlFileSink,
    MemorySink,
    PublishError,
    PubSubSink,
    Sink,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "STATUSES",
    "Clock",
    "ContextSource",
    "Emitter",
    "EncodedMessage",
    "JoinContext",
    "JsonlFileSink",
    "MemorySink",
    "PubSubSink",
    "PublishError",
    "Receipt",
    "Sink",
    "Status",
    "encode_message",
    "now_rfc3339",
    "open_message",
    "receipt_message",
]
