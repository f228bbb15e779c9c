"""Drain, as the Beam model defines it (decided and documented): Dataflow's drain stops
reading and moves the watermark to infinity, so every pending event-time timer fires. Offline,
a TestStream whose watermark jumps from before any deadline straight to infinity shows the
join's timers firing there: every open join closes as at its deadline.

The closes are observed by a ParDo right after the join, not by ``assert_that``: on the local
``BundleBasedDirectRunner`` a GroupByKey in the global window (``assert_that``'s, or the
streaming write's) fires at the final jump before the outputs of the timers that jump fired
reach it, so it sees nothing (observed here; docs/beam-notes.md). Dataflow holds a stateful
step's output watermark until its timers fired; that the drained job's files then hold those
closes only a real Dataflow drain can show."""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.utils.timestamp import Timestamp

from fanin.contracts.catalog import Catalog, JoinDefaults
from fanin.contracts.parsing import parse_message
from fanin.contracts.timefmt import format_ms, parse_rfc3339
from fanin.transforms.join import JoinRecords

T0 = parse_rfc3339("2026-01-01T00:00:00Z")


def _keyed(message: dict[str, object]) -> tuple[str, tuple]:
    record, dead = parse_message(json.dumps(message), {"kind": "test"}, frozenset())
    assert dead is None, dead
    return message["join_id"], record  # type: ignore[return-value]


class _Seen(beam.DoFn):
    """Records what reaches it (same process: the local runner)."""

    seen: list[tuple[str, str, list[str]]] = []

    def process(self, close: dict) -> None:
        _Seen.seen.append((close["join_id"], close["reason"], sorted(close["branches"])))


def test_watermark_to_infinity_closes_every_open_join() -> None:
    opens = [_keyed({"kind": "open", "join_id": f"j{i}", "opened_at": format_ms(T0),
                     "required": ["a", "b"], "deadline_s": 30 + i,
                     "allow_partial": i % 2 == 0}) for i in range(4)]
    receipts = [_keyed({"join_id": f"j{i}", "branch": "a", "status": "ok",
                        "event_time": format_ms(T0 + 1000)}) for i in range(4)]
    stream = (TestStream()
              .advance_watermark_to(Timestamp(micros=T0 * 1000))
              .add_elements(opens + receipts)
              .advance_watermark_to(Timestamp(micros=(T0 + 2000) * 1000))  # before any D
              .advance_watermark_to_infinity())  # what drain does
    options = PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    _Seen.seen = []
    with beam.Pipeline(options=options) as p:
        joined = (p | stream | JoinRecords(Catalog({}, JoinDefaults()), streaming=True))
        _ = joined["closes"] | beam.ParDo(_Seen())
    assert sorted(_Seen.seen) == [(f"j{i}", "partial" if i % 2 == 0 else "timeout", ["a"])
                                  for i in range(4)]
