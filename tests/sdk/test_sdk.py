"""Tests of the emitter SDK: contexts, opens, receipts (sync and async), sinks."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
from collections.abc import Collection
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import pytest

from fanin.contracts.parsing import parse_message
from fanin.sdk import (
    Emitter,
    JoinContext,
    JsonlFileSink,
    MemorySink,
    PublishError,
    PubSubSink,
)
from fanin.sdk.sinks import EncodedMessage

CONTRACTS = {"triage"}


class FakeClock:
    """Wall clock and monotonic timer in one; ``advance`` moves both."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture
def emitter(sink: MemorySink, clock: FakeClock) -> Emitter:
    ids = itertools.count(1)
    return Emitter(sink, clock=clock, timer=clock, new_id=lambda: f"id-{next(ids)}")


@pytest.fixture
def ctx(clock: FakeClock) -> JoinContext:
    return JoinContext.new(contract="triage", run_id="run-1", join_id="j-1", clock=clock)


def messages(sink: MemorySink) -> list[dict[str, Any]]:
    """Every emitted line, checked against docs/spec.md §1 by the pipeline's own parser."""
    for line in sink.lines:
        _, dead = parse_message(line, {}, CONTRACTS)
        assert dead is None, dead
    return [json.loads(line) for line in sink.lines]


def test_context_round_trips_and_validates(clock: FakeClock) -> None:
    ctx = JoinContext.new(contract="triage", run_id="r", clock=clock)
    assert ctx.opened_at == "2026-01-01T00:00:00.000Z"
    assert len(ctx.join_id) == 32 and ctx.join_id != JoinContext.new().join_id
    assert JoinContext.from_json(ctx.to_json()) == ctx
    assert JoinContext.from_dict(ctx.to_dict()) == ctx
    assert JoinContext.from_dict({"join_id": "a", "opened_at": ctx.opened_at}).contract is None
    with pytest.raises(ValueError, match="unknown"):
        JoinContext.from_dict({**ctx.to_dict(), "jion_id": "x"})
    with pytest.raises(ValueError, match="opened_at"):
        JoinContext.from_dict({"join_id": "a"})
    with pytest.raises(ValueError, match="opened_at"):
        JoinContext(join_id="a", opened_at="2026-01-01 00:00:00")
    with pytest.raises(ValueError, match="join_id"):
        JoinContext(join_id="x" * 257, opened_at=ctx.opened_at)


def test_context_from_json_refuses_a_field_given_twice() -> None:
    """``from_json`` reads JSON as the pipeline does (docs/spec.md §1): a repeated field name
    is refused, never the last one taken (a context then reported to another join)."""
    text = '{"join_id":"a","opened_at":"2026-01-01T00:00:00.000Z","join_id":"b"}'
    with pytest.raises(ValueError, match="join_id"):
        JoinContext.from_json(text)
    with pytest.raises(ValueError):
        JoinContext.from_json(text.encode())
    assert JoinContext.from_json(text.replace(',"join_id":"b"', "").encode()).join_id == "a"


def test_context_keeps_opened_at_as_utc_milliseconds() -> None:
    """The context carries ``opened_at`` in RFC 3339 UTC with milliseconds, whatever RFC 3339
    form it was given: the same instant, truncated to the millisecond as the pipeline reads
    it."""
    for given in ("2026-01-01T00:00:00.123456-23:59", "2026-01-01t23:59:00.1239+00:00",
                  "2026-01-01T23:59:00.123Z"):
        ctx = JoinContext(join_id="a", opened_at=given)
        assert ctx.opened_at == "2026-01-01T23:59:00.123Z", given
        assert JoinContext.from_json(ctx.to_json()) == ctx
        assert ctx.with_attempt(2).opened_at == ctx.opened_at


def test_open_carries_overrides(emitter: Emitter, sink: MemorySink, ctx: JoinContext) -> None:
    emitter.open(ctx, required=["retrieve", "review/legal"], optional=["enrich"],
                 deadline_s=12.5, allow_partial=True)
    (msg,) = messages(sink)
    assert msg == {"kind": "open", "join_id": "j-1", "opened_at": ctx.opened_at,
                   "contract": "triage", "run_id": "run-1", "message_id": "id-1",
                   "required": ["retrieve", "review/legal"], "optional": ["enrich"],
                   "deadline_s": 12.5, "allow_partial": True}
    with pytest.raises(ValueError, match="deadline_s"):
        emitter.open(ctx, deadline_s=0)


def test_sync_decorator_ok_error_timeout(emitter: Emitter, sink: MemorySink,
                                         ctx: JoinContext, clock: FakeClock) -> None:
    @emitter.branch(ctx, "retrieve")
    def retrieve(n: int) -> list[int]:
        clock.advance(0.25)
        return list(range(n))

    @emitter.branch(ctx, "verify")
    def verify() -> None:
        raise RuntimeError("checker down")

    @emitter.branch(ctx, "rank", key="score", timeout_s=1.0)
    def rank() -> float:
        clock.advance(1.5)
        return 0.9

    assert retrieve(3) == [0, 1, 2]
    assert retrieve.__name__ == "retrieve"
    with pytest.raises(RuntimeError, match="checker down"):
        verify()
    assert rank() == 0.9  # the caller still gets the value; the join hears "timeout"
    ok, error, timeout = messages(sink)
    assert ok == {"kind": "receipt", "join_id": "j-1", "branch": "retrieve", "status": "ok",
                  "event_time": "2026-01-01T00:00:00.250Z", "attempt": 1,
                  "opened_at": ctx.opened_at, "contract": "triage", "run_id": "run-1",
                  "message_id": "id-1", "value": [0, 1, 2]}
    assert (error["status"], error["error"]) == ("error", "RuntimeError: checker down")
    assert "value" not in error
    assert (timeout["status"], timeout["key"]) == ("timeout", "score")
    assert "over timeout_s=1" in timeout["error"]


def test_context_manager_sync_and_skip(emitter: Emitter, sink: MemorySink,
                                       ctx: JoinContext) -> None:
    with emitter.receipt(ctx, "review/legal") as r:
        r.value = {"approved": True}
    with pytest.raises(KeyError), emitter.receipt(ctx, "review/tech"):
        raise KeyError("clause 7")
    emitter.skip(ctx, "enrich")
    emitter.skip(ctx, "enrich")
    ok, error, skip, skip_again = messages(sink)
    assert (ok["status"], ok["value"], r.message) == ("ok", {"approved": True}, ok)
    assert error["error"] == "KeyError: 'clause 7'"
    assert skip["status"] == skip_again["status"] == "skipped"
    assert skip["attempt"] == skip_again["attempt"] == 1
    assert skip["message_id"] != skip_again["message_id"]
    with pytest.raises(RuntimeError, match="single use"), r:
        pass


def test_async_decorator_and_context_manager(emitter: Emitter, sink: MemorySink,
                                             ctx: JoinContext, clock: FakeClock) -> None:
    @emitter.branch(lambda task: task["ctx"], "retrieve")
    async def retrieve(task: dict[str, Any]) -> str:
        return task["doc"]

    @emitter.branch(ctx, "verify")
    async def verify() -> None:
        raise ValueError("bad doc")

    @emitter.branch(ctx, "rank", timeout_s=0.001)
    async def rank() -> None:
        await asyncio.Event().wait()  # never set: wait_for cancels it

    async def run() -> None:
        assert await retrieve({"ctx": ctx, "doc": "d1"}) == "d1"
        with pytest.raises(ValueError):
            await verify()
        with pytest.raises(TimeoutError):
            await rank()
        async with emitter.receipt(ctx, "enrich") as r:
            r.value = 1
        async with emitter.receipt(ctx, "enrich", timeout_s=2) as late:
            clock.advance(3)
            late.value = 2

    asyncio.run(run())
    statuses = [(m["branch"], m["status"], m["attempt"]) for m in messages(sink)]
    assert statuses == [("retrieve", "ok", 1), ("verify", "error", 1), ("rank", "timeout", 1),
                        ("enrich", "ok", 1), ("enrich", "timeout", 2)]


def test_cancellation_emits_nothing(emitter: Emitter, sink: MemorySink,
                                    ctx: JoinContext) -> None:
    with pytest.raises(asyncio.CancelledError), emitter.receipt(ctx, "retrieve"):
        raise asyncio.CancelledError
    assert sink.lines == []


def test_attempts_bump_per_join_and_branch(emitter: Emitter, sink: MemorySink,
                                           ctx: JoinContext, clock: FakeClock) -> None:
    other = JoinContext.new(contract="triage", join_id="j-2", clock=clock)

    @emitter.branch(lambda c: c, "verify")
    def verify(c: JoinContext) -> str:
        return c.join_id

    verify(ctx)
    verify(ctx)
    verify(other)
    emitter.emit(ctx, "verify", "error", error="from a worker", attempt=5)
    verify(ctx)
    assert [(m["join_id"], m["attempt"]) for m in messages(sink)] == [
        ("j-1", 1), ("j-1", 2), ("j-2", 1), ("j-1", 5), ("j-1", 6)]


def test_non_json_values_fail_loudly(emitter: Emitter, sink: MemorySink,
                                     ctx: JoinContext) -> None:
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        emitter.emit(ctx, "rank", "ok", value=object())
    assert sink.lines == []

    @emitter.branch(ctx, "rank")
    def rank() -> float:
        return float("nan")

    with pytest.raises(TypeError, match="branch 'rank'"):
        rank()
    (msg,) = messages(sink)  # the join hears about it before its deadline
    assert msg["status"] == "error" and "not JSON-serialisable" in msg["error"]


def test_oversized_message_is_refused(sink: MemorySink, ctx: JoinContext) -> None:
    with pytest.raises(ValueError, match=r"too_large\): \d+ bytes > limit 100"):
        Emitter(sink, max_bytes=100).emit(ctx, "rank", "ok", value="x" * 200)


def test_default_message_ids_are_unique(sink: MemorySink, ctx: JoinContext) -> None:
    emitter = Emitter(sink)
    for _ in range(50):
        emitter.emit(ctx, "rank", "ok", value=1)
    assert len({m["message_id"] for m in messages(sink)}) == 50


def test_jsonl_sink_appends_whole_lines_from_threads(tmp_path: Path, ctx: JoinContext) -> None:
    path = tmp_path / "receipts.jsonl"
    path.write_text('{"kind":"open","join_id":"old","opened_at":"2026-01-01T00:00:00Z"}\n')
    with JsonlFileSink(path) as sink:
        emitter = Emitter(sink)

        def work(n: int) -> None:
            for i in range(100):
                emitter.emit(ctx, f"part/{n}", "ok", value={"i": i, "pad": "é" * 50})

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        emitter.flush()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 801 and json.loads(lines[0])["join_id"] == "old"
    for line in lines:
        assert parse_message(line, {}, CONTRACTS)[1] is None
    with pytest.raises(ValueError, match="closed"):
        sink.publish(EncodedMessage("{}", "j", "m", "t"))


class FakePublisher:
    """Stands in for ``pubsub_v1.PublisherClient``; ``fail`` makes publishes fail."""

    def __init__(self, fail: Collection[int] = ()) -> None:
        self.fail = fail
        self.published: list[tuple[str, bytes, str, dict[str, str]]] = []
        self.resumed: list[tuple[str, str]] = []
        self.stopped = False

    def publish(self, topic: str, data: bytes, ordering_key: str = "",
                **attrs: str) -> Future[str]:
        self.published.append((topic, data, ordering_key, attrs))
        future: Future[str] = Future()
        if len(self.published) in self.fail:
            future.set_exception(RuntimeError("DEADLINE_EXCEEDED after retries"))
        else:
            future.set_result(str(len(self.published)))
        return future

    def resume_publish(self, topic: str, ordering_key: str) -> None:
        self.resumed.append((topic, ordering_key))

    def stop(self) -> None:
        self.stopped = True


def test_pubsub_sink_publishes_with_attributes_and_ordering(ctx: JoinContext) -> None:
    fake = FakePublisher()
    sink = PubSubSink("projects/p/topics/t", ordering_by_join=True, publisher=fake)
    emitter = Emitter(sink)
    sent = emitter.emit(ctx, "rank", "ok", value=0.5)
    emitter.close()
    ((topic, data, key, attrs),) = fake.published
    assert (topic, key) == ("projects/p/topics/t", "j-1")
    assert json.loads(data) == sent
    assert attrs == {"event_time": sent["event_time"], "message_id": sent["message_id"]}
    assert not fake.stopped  # an injected client belongs to the caller
    unordered = FakePublisher()
    Emitter(PubSubSink("projects/p/topics/t", publisher=unordered)).open(ctx)
    assert unordered.published[0][2] == ""


def test_pubsub_failure_surfaces_on_flush(ctx: JoinContext) -> None:
    fake = FakePublisher(fail={2})
    sink = PubSubSink("projects/p/topics/t", ordering_by_join=True, publisher=fake)
    emitter = Emitter(sink)
    emitter.open(ctx)
    failed = emitter.emit(ctx, "rank", "ok", value=0.5)
    emitter.emit(ctx, "verify", "ok")
    with pytest.raises(PublishError, match=failed["message_id"]) as raised:
        emitter.flush()
    assert [m.message_id for m, _ in raised.value.failures] == [failed["message_id"]]
    assert "1 message(s) failed" in str(raised.value)
    assert fake.resumed == [("projects/p/topics/t", "j-1")]
    emitter.flush()  # reported once; nothing pending any more
    emitter.close()
    with pytest.raises(ValueError, match="closed"):
        emitter.open(ctx)


def test_pubsub_sink_builds_a_batching_ordered_client(monkeypatch: pytest.MonkeyPatch) -> None:
    from google.cloud import pubsub_v1

    made: dict[str, Any] = {}

    class Client(FakePublisher):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__()
            made.update(kwargs)

    monkeypatch.setattr(pubsub_v1, "PublisherClient", Client)
    sink = PubSubSink("projects/p/topics/t", ordering_by_join=True)
    assert made["publisher_options"].enable_message_ordering is True
    assert made["batch_settings"].max_messages == 100
    sink.close()
    assert sink._publisher.stopped  # the sink created it, so the sink stops it


def test_an_ordered_sink_stops_its_client_once_every_publish_is_settled(
        monkeypatch: pytest.MonkeyPatch, ctx: JoinContext) -> None:
    """The client's stop() sends only the first pending batch of an ordering key and cancels
    the rest, so ``close`` with ordering flushes first (the emulator test shows the loss)."""
    from google.cloud import pubsub_v1

    class Client(FakePublisher):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__()
            self.pending: list[Future[str]] = []
            self.pending_at_stop = -1

        def publish(self, topic: str, data: bytes, ordering_key: str = "",
                    **attrs: str) -> Future[str]:
            self.published.append((topic, data, ordering_key, attrs))
            self.pending.append(Future())
            return self.pending[-1]

        def stop(self) -> None:
            self.pending_at_stop = sum(not f.done() for f in self.pending)
            self.stopped = True

    monkeypatch.setattr(pubsub_v1, "PublisherClient", Client)
    for ordering, pending_at_stop in ((True, 0), (False, 3)):
        sink = PubSubSink("projects/p/topics/t", ordering_by_join=ordering, flush_timeout_s=30)
        client = cast(Client, sink._publisher)
        emitter = Emitter(sink)
        for branch in ("a", "b", "c"):
            emitter.emit(ctx, branch, "ok")
        confirm = threading.Timer(0.2, lambda c=client: [f.set_result("id") for f in c.pending])
        confirm.start()
        emitter.close()
        confirm.join()
        assert (client.stopped, client.pending_at_stop) == (True, pending_at_stop)
    sink = PubSubSink("projects/p/topics/t", ordering_by_join=True, flush_timeout_s=0.2)
    client = cast(Client, sink._publisher)
    Emitter(sink).emit(ctx, "a", "ok")
    with pytest.raises(PublishError, match="not confirmed within flush_timeout_s"):
        sink.close()
    assert client.stopped  # stopped also when the flush gave up


class UnansweredPublisher(FakePublisher):
    """A client whose publishes are never confirmed (Pub/Sub, or its emulator, not answering)."""

    def publish(self, topic: str, data: bytes, ordering_key: str = "",
                **attrs: str) -> Future[str]:
        self.published.append((topic, data, ordering_key, attrs))
        return Future()


def test_a_flush_that_waits_says_so(monkeypatch: pytest.MonkeyPatch, ctx: JoinContext,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """Nothing confirms: the flush warns once after NOTICE_S (it waited flush_timeout_s, five
    minutes by default, in silence), then gives up as before."""
    monkeypatch.setattr(PubSubSink, "NOTICE_S", 0.05)
    sink = PubSubSink("projects/p-test/topics/t", publisher=UnansweredPublisher(),
                      flush_timeout_s=0.3)
    Emitter(sink).emit(ctx, "a", "ok")
    with caplog.at_level(logging.WARNING), \
            pytest.raises(PublishError, match="not confirmed within flush_timeout_s"):
        sink.flush()
    notices = [r.getMessage() for r in caplog.records if "a flush waits" in r.getMessage()]
    assert len(notices) == 1
    assert "1 message(s) not confirmed after 0.05s; waiting for up to flush_timeout_s=0.3s" \
        in notices[0]
