"""Issue 13, item 1 as a property of the streaming write: whatever the event times of the
outputs and however far the watermark runs ahead of them, every output is written to exactly
one file, and the file names are those of panes of the global window."""

from __future__ import annotations

import json
import re
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_stream
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanin.contracts.timefmt import MAX_MS
from fanin.transforms.write import WriteOutput

MIN_MS = -62135596800000  # 0001-01-01T00:00:00Z
times = st.integers(MIN_MS, MAX_MS)
# a step of the stream: outputs with their event times, or a watermark advance
steps = st.lists(st.one_of(st.tuples(st.just("add"), st.lists(times, min_size=1, max_size=6)),
                           st.tuples(st.just("wm"), times)), min_size=1, max_size=12)


def _run(folder: Path, script: list[tuple[str, object]], pane_lines: int, shards: int) -> int:
    """The script through the streaming ``WriteOutput``; returns how many outputs it added."""
    stream, n, watermark = test_stream.TestStream(), 0, MIN_MS
    for op, arg in script:
        if op == "add":
            stream.add_elements([TimestampedValue({"join_id": f"j{n + i}", "t": t},
                                                  Timestamp(micros=t * 1000))
                                 for i, t in enumerate(arg)])
            n += len(arg)
        elif arg > watermark:
            stream.advance_watermark_to(Timestamp(micros=arg * 1000))
            watermark = arg
    stream.advance_watermark_to_infinity()
    options = PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    with beam.Pipeline(options=options) as p:
        _ = p | stream | WriteOutput(str(folder), "late", streaming=True, shards=shards,
                                     pane_lines=pane_lines)
    return n


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps, pane_lines=st.integers(1, 4), shards=st.integers(1, 3))
def test_every_output_is_written_once_whatever_its_event_time(
        tmp_path_factory: object, script: list[tuple[str, object]], pane_lines: int,
        shards: int) -> None:
    folder = tmp_path_factory.mktemp("write")  # type: ignore[attr-defined]
    n = _run(folder, script, pane_lines, shards)
    files = sorted(folder.iterdir())
    name = re.compile(r"late-[0-9a-f]{12}-p\d{4,}-s\d{3}\.jsonl")  # job token, pane, shard
    assert all(name.fullmatch(f.name) for f in files), files
    ids = [json.loads(line)["join_id"] for f in files for line in f.read_text().splitlines()]
    assert sorted(ids) == sorted(f"j{i}" for i in range(n))
    for f in files:  # no empty file, lines sorted
        lines = f.read_text().splitlines()
        assert lines and lines == sorted(lines)
