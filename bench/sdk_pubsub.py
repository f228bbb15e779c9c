"""Benchmark: the emitter SDK's throughput into Google's Pub/Sub emulator.

Usage: ``python bench/sdk_pubsub.py [--messages 20000] [--repeats 3] [--code DIR]``

Each repeat creates a topic and a subscription on the emulator, then one ``Emitter`` over a
``PubSubSink`` (the client the sink creates: batches of up to 100 messages / 1 MB / 50 ms)
emits ``--messages`` receipts of small JSON values from one thread and closes the emitter
(which waits until every publish is confirmed). The figures: the time to emit (calls return),
the time until ``close()`` returned (every message confirmed by the emulator), messages per
second end to end, the CPU time this process spent per message (all its threads: the SDK and
the Pub/Sub client; less sensitive than wall time to other load on the machine), and the
largest number of messages the sink held at once (sampled after
each emit). The subscription is then drained and every message is checked to have arrived.

The emulator is started for the run (``tests/support/emulator.py``: ``gcloud beta emulators
pubsub start`` on a free port of 127.0.0.1) unless ``PUBSUB_EMULATOR_HOST`` is already set.

``--code DIR`` imports ``fanin`` from ``DIR`` first (to measure another version of the SDK:
``git archive <commit> fanin | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _held(sink: Any) -> int:
    """Messages the sink holds now (old sinks keep a ``_pending`` list, new ones a count)."""
    held = getattr(sink, "held", None)
    if callable(held):
        return int(held())
    return len(getattr(sink, "_pending", ()))


def _one_run(emulator: Any, messages: int) -> dict[str, float]:
    from fanin.sdk import Emitter, JoinContext, PubSubSink

    topic, subscription = emulator.topic_and_subscription("bench", ack_deadline_s=60)
    sink = PubSubSink(topic)
    emitter = Emitter(sink)
    contexts = [JoinContext.new(run_id="bench") for _ in range(max(1, messages // 10))]
    peak = 0
    cpu_start = time.process_time()
    start = time.perf_counter()
    for i in range(messages):
        emitter.emit(contexts[i // 10], f"part/{i % 10}", "ok", value={"i": i, "score": 0.5})
        if i % 100 == 0:
            peak = max(peak, _held(sink))
    emitted = time.perf_counter()
    emitter.close()
    closed = time.perf_counter()
    cpu_us = (time.process_time() - cpu_start) * 1e6 / messages
    arrived = len(emulator.collect(subscription, lambda got: len(got) >= messages, 120))
    if arrived != messages:
        raise SystemExit(f"only {arrived} of {messages} messages arrived")
    return {"emit_s": emitted - start, "total_s": closed - start,
            "rate": messages / (closed - start), "peak_held": peak, "cpu_us": cpu_us}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--code", metavar="DIR", help="import fanin from DIR")
    args = parser.parse_args(argv)
    if args.code:
        sys.path.insert(0, str(Path(args.code).resolve()))
    sys.path.insert(0, str(ROOT / "tests"))
    from support.emulator import PubSubEmulator

    import fanin.sdk

    print(f"fanin.sdk from {Path(fanin.sdk.__file__).parent}; {args.messages} receipts x "
          f"{args.repeats}")
    with tempfile.TemporaryDirectory() as data_dir:
        emulator = PubSubEmulator(Path(data_dir))
        emulator.start()
        os.environ["PUBSUB_EMULATOR_HOST"] = emulator.host
        try:
            runs = [_one_run(emulator, args.messages) for _ in range(args.repeats)]
        finally:
            emulator.stop()
    for n, run in enumerate(runs, 1):
        print(f"run {n}: emit {run['emit_s']:.2f}s, confirmed {run['total_s']:.2f}s, "
              f"{run['rate']:,.0f} msg/s, {run['cpu_us']:.0f} us CPU/msg, "
              f"peak held {run['peak_held']:,.0f}")
    print(f"median: {statistics.median(r['rate'] for r in runs):,.0f} msg/s end to end, "
          f"{statistics.median(r['cpu_us'] for r in runs):.0f} us CPU per message (this "
          f"process, all threads); peak held {max(r['peak_held'] for r in runs):,.0f} messages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
