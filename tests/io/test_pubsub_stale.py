"""Messages older than the tombstone retention, received on
Pub/Sub, are reported in one warning with counts (against Google's Pub/Sub emulator)."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from support.emulator import PubSubEmulator, wait_for

from fanin.contracts.catalog import JoinDefaults
from fanin.contracts.timefmt import format_ms
from fanin.io.pubsub import _StaleReport, report_stale
from fanin.io.pubsub_drain import Drain
from fanin.pipelines.pipeline import RunConfig, build, catalog_for

OLD = "2026-01-01T00:00:00.000Z"


def test_messages_older_than_retention_are_reported_once_with_counts(
    pubsub_emulator: PubSubEmulator, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic, subscription = pubsub_emulator.topic_and_subscription("stale")
    now = format_ms(int(time.time() * 1000))
    old = [{"kind": "open", "join_id": f"old-{i}", "opened_at": OLD, "required": ["a"]}
           for i in range(5)]
    fresh = [{"kind": "open", "join_id": "fresh", "opened_at": now, "required": ["a"]},
             {"join_id": "fresh", "branch": "a", "status": "ok", "event_time": now}]
    def publish(messages: list[dict[str, Any]]) -> None:
        for message in messages:
            stamp = message.get("event_time") or message["opened_at"]
            pubsub_emulator.publish(topic, json.dumps(message).encode(), event_time=stamp)

    publish(old[:3] + fresh)
    # retention 1 day: deadline 30 s + 1 day is the horizon a message may be behind the clock
    config = RunConfig(output=str(tmp_path / "out"), subscription=subscription, window_s=1,
                       defaults=JoinDefaults(retention_s=86400))
    p = beam.Pipeline(options=PipelineOptions(["--runner=BundleBasedDirectRunner",
                                               "--streaming"]))
    drain = Drain()
    build(p, config, catalog_for(config), drain)
    caplog.set_level(logging.WARNING, logger="fanin")
    known = set(_StaleReport._SHARED)
    result = p.run()
    counter = MetricsFilter().with_name("pubsub_older_than_retention")

    def counted() -> int:
        return sum(c.committed or 0 for c in result.metrics().query(counter)["counters"])

    try:
        assert wait_for(lambda: counted() == 3 and any(
            "older than the longest" in r.getMessage() for r in caplog.records), 60, 0.2)
        # more of them, in later bundles (the local runner runs each with a fresh copy of the
        # reading step, and its metrics keep the first bundle's counts only: the report's own)
        publish(old[3:])
        (token,) = set(_StaleReport._SHARED) - known  # this run's read
        assert wait_for(lambda: _StaleReport._SHARED[token].total == len(old), 60, 0.2)
        drain.request()
        result.wait_until_finish()
    finally:
        if not drain.requested:
            result.cancel()
    report_stale()  # the run's end (run_pipeline calls it)
    warnings = [message for message in (r.getMessage() for r in caplog.records)
                if "older than the longest" in message]
    # one warning within the minute, and the rest at the end, with the running total
    assert len(warnings) == 2
    assert sum(int(re.search(r"\((\d+) since the last report", w).group(1))
               for w in warnings) == len(old)
    assert warnings[-1].startswith(f"fanin: {len(old)} Pub/Sub message(s) (")
    assert f"oldest event time {OLD}" in warnings[-1]
    assert "(86430 s)" in warnings[0] and "fanin simulate --start now" in warnings[0]
    closed = sorted(json.loads(line)["join_id"] for path in (tmp_path / "out" / "closes").iterdir()
                    for line in path.read_text().splitlines())
    assert closed == sorted(["fresh", *(message["join_id"] for message in old)])
