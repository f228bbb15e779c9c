"""Against Google's Pub/Sub emulator with the real client: nothing is lost
when ``close()`` is forgotten, ``flush_timeout_s`` bounds a whole flush, and a sink holds only
unconfirmed messages, up to a bound."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from support.child_env import same_code_env
from support.emulator import PubSubEmulator, wait_for

from fanin.sdk import Emitter, JoinContext, PublishError, PubSubSink

ONE_SHOT = textwrap.dedent("""
    import sys
    from google.cloud import pubsub_v1
    from fanin.sdk import Emitter, JoinContext, PubSubSink

    # a 10 s batch latency: without a flush at exit, nothing would be sent before the exit
    emitter = Emitter(PubSubSink(sys.argv[1], batch_settings=pubsub_v1.types.BatchSettings(
        max_messages=100, max_bytes=1_000_000, max_latency=10)))
    ctx = JoinContext.new(run_id="one-shot")
    emitter.open(ctx, required=["a"])
    emitter.emit(ctx, "a", "ok", value=1)
    print("exiting without close()")
""")


def test_a_script_that_forgets_close_still_delivers_and_warns(
        pubsub_emulator: PubSubEmulator, tmp_path: Path) -> None:
    topic, subscription = pubsub_emulator.topic_and_subscription("oneshot")
    done = subprocess.run([sys.executable, "-c", ONE_SHOT, topic], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=same_code_env())
    assert done.returncode == 0, done.stderr
    assert "UnflushedMessagesWarning" in done.stderr
    assert f"PubSubSink({topic!r}) held 2 unflushed message(s) at interpreter exit" in done.stderr
    got = pubsub_emulator.collect(subscription, lambda msgs: len(msgs) >= 2, 30)
    assert sorted(json.loads(m.data)["kind"] for m in got) == ["open", "receipt"]


FORKED_CHILD = textwrap.dedent("""
    import multiprocessing, sys
    from google.cloud import pubsub_v1
    from fanin.sdk import Emitter, JoinContext, PubSubSink

    def agent(topic):  # a forked worker that forgets close(): it ends with os._exit
        emitter = Emitter(PubSubSink(topic, batch_settings=pubsub_v1.types.BatchSettings(
            max_messages=100, max_bytes=1_000_000, max_latency=10)))
        ctx = JoinContext.new(run_id="forked")
        emitter.open(ctx, required=["a"])
        emitter.emit(ctx, "a", "ok", value=1)

    if __name__ == "__main__":
        child = multiprocessing.get_context("fork").Process(target=agent, args=(sys.argv[1],))
        child.start()
        child.join()
        print(child.exitcode)
""")


def test_a_forked_child_that_forgets_close_still_delivers_and_warns(
        pubsub_emulator: PubSubEmulator, tmp_path: Path) -> None:
    """A multiprocessing child runs no atexit handler (it ends with os._exit): its unflushed
    messages were lost without a word."""
    topic, subscription = pubsub_emulator.topic_and_subscription("forked")
    script = tmp_path / "forked.py"
    script.write_text(FORKED_CHILD)
    done = subprocess.run([sys.executable, str(script), topic], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=same_code_env())
    assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr
    assert f"PubSubSink({topic!r}) held 2 unflushed message(s) at interpreter exit" in done.stderr
    got = pubsub_emulator.collect(subscription, lambda msgs: len(msgs) >= 2, 30)
    assert sorted(json.loads(m.data)["kind"] for m in got) == ["open", "receipt"]


def test_emitter_is_a_context_manager_sync_and_async(pubsub_emulator: PubSubEmulator) -> None:
    topic, subscription = pubsub_emulator.topic_and_subscription("with")
    ctx = JoinContext.new(run_id="with")
    with Emitter(PubSubSink(topic)) as emitter:
        emitter.open(ctx, required=["a", "b"])
        emitter.emit(ctx, "a", "ok", value=1)
    assert emitter.sink.held() == 0  # closed: every publish confirmed

    async def agent() -> None:
        async with Emitter(PubSubSink(topic)) as emitter, emitter.receipt(ctx, "b") as r:
            r.value = 2

    asyncio.run(agent())
    got = pubsub_emulator.collect(subscription, lambda msgs: len(msgs) >= 3, 30)
    assert sorted(json.loads(m.data).get("branch", "") for m in got) == ["", "a", "b"]
    with pytest.raises(ValueError, match="closed"):
        emitter.emit(ctx, "a", "ok")


def test_confirmed_messages_are_released_without_a_flush(pubsub_emulator: PubSubEmulator) -> None:
    topic, subscription = pubsub_emulator.topic_and_subscription("release", ack_deadline_s=60)
    sink = PubSubSink(topic, max_held=500)
    emitter = Emitter(sink)
    ctx = JoinContext.new(run_id="release")
    peak = 0
    for i in range(3000):
        emitter.emit(ctx, f"part/{i}", "ok", value=i)
        peak = max(peak, sink.held())
    assert peak <= 500  # the bound holds under load (publish waits for room)
    assert wait_for(lambda: sink.held() == 0, 30)  # each confirmed publish let go, no flush
    got = pubsub_emulator.collect(subscription, lambda msgs: len(msgs) >= 3000, 60)
    assert len({m.attributes["message_id"] for m in got}) == 3000
    emitter.close()


def test_flush_timeout_is_a_deadline_for_the_whole_flush(pubsub_emulator: PubSubEmulator) -> None:
    topic = pubsub_emulator.topic("killed")
    sink = PubSubSink(topic, flush_timeout_s=3)
    emitter = Emitter(sink)
    ctx = JoinContext.new(run_id="killed")
    for i in range(20):
        emitter.emit(ctx, f"before/{i}", "ok", value=i)
    emitter.flush()
    pubsub_emulator.stop()  # the emulator dies mid-send
    try:
        sent = [emitter.emit(ctx, f"after/{i}", "ok", value=i) for i in range(200)]
        started = time.monotonic()
        with pytest.raises(PublishError) as raised:
            emitter.flush()
        waited = time.monotonic() - started
        failures = raised.value.failures
        assert {m.message_id for m, _ in failures} == {m["message_id"] for m in sent}
        for message, exc in failures:
            assert "not confirmed within flush_timeout_s=3s" in str(exc)
            assert f"message_id={message.message_id}" in str(raised.value) or \
                len(failures) > 20
        assert "200 message(s) failed to publish" in str(raised.value)
        assert waited < 3 + 10  # one deadline for 200 messages, not 3 s each
        assert sink.held() == 0
        started = time.monotonic()
        emitter.close()  # publishes given up on are not waited for again
        assert time.monotonic() - started < 10
    finally:
        pubsub_emulator.restart()


def test_a_full_sink_pushes_back_then_refuses_clearly(pubsub_emulator: PubSubEmulator) -> None:
    topic = pubsub_emulator.topic("full")
    sink = PubSubSink(topic, max_held=20, flush_timeout_s=1)
    emitter = Emitter(sink)
    ctx = JoinContext.new(run_id="full")
    pubsub_emulator.stop()
    try:
        for i in range(20):
            emitter.emit(ctx, f"p/{i}", "ok", value=i)
        with pytest.raises(PublishError, match=r"not sent: the sink held 20 unconfirmed") as full:
            emitter.emit(ctx, "p/20", "ok", value=20)
        ((refused, _),) = full.value.failures
        assert json.loads(refused.line)["branch"] == "p/20"
        assert sink.held() == 20
        with pytest.raises(PublishError, match="20 message"):
            emitter.close()
    finally:
        pubsub_emulator.restart()


def test_close_with_ordering_delivers_every_batch_of_a_join(
        pubsub_emulator: PubSubEmulator) -> None:
    """One join's messages fill several batches of its ordering key; the client's stop() sends
    only the first and cancels the rest ("Batch cancelled because the publisher client has been
    stopped"), so ``close`` must not stop it before they are confirmed."""
    topic, subscription = pubsub_emulator.topic_and_subscription("ordered", ack_deadline_s=60)
    sink = PubSubSink(topic, ordering_by_join=True)
    emitter = Emitter(sink)
    ctx = JoinContext.new(run_id="ordered-close")
    sent = [emitter.open(ctx, required=[f"b{i}" for i in range(19)])]
    sent += [emitter.emit(ctx, f"b{i}", "ok", value="z" * 240_000) for i in range(19)]
    emitter.close()  # ~4.6 MB of one ordering key: five batches of at most 1 MB
    assert sink.held() == 0
    got: list[Any] = []
    wanted = {m["message_id"] for m in sent}

    def all_arrived() -> bool:
        got.extend(pubsub_emulator.pull(subscription, max_messages=5))
        return {m.attributes["message_id"] for m in got} >= wanted

    assert wait_for(all_arrived, 60, 0.1), f"{len(got)} of {len(wanted)} arrived"
    arrived = [json.loads(m.data) for m in got]
    assert sorted(m["message_id"] for m in arrived) == sorted(wanted)
    emitter.close()  # idempotent
