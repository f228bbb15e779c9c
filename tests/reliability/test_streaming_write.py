"""A property of the streaming write: whatever the event times of the
outputs and however far the watermark runs ahead of them, every output is written to exactly
one file, and the file names are those of panes of the global window."""

from __future__ import annotations

import json
import re
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_stream
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanin.contracts.timefmt import MAX_MS
from fanin.pipelines.config import RunConfig
from fanin.pipelines.runner_choice import early_firing
from fanin.transforms.write import AT_END, BY_COUNT_OR_TIME, BY_TIME, WriteOutput

MIN_MS = -62135596800000  # 0001-01-01T00:00:00Z
times = st.integers(MIN_MS, MAX_MS)
# a step of the stream: outputs with their event times, or a watermark advance
steps = st.lists(st.one_of(st.tuples(st.just("add"), st.lists(times, min_size=1, max_size=6)),
                           st.tuples(st.just("wm"), times)), min_size=1, max_size=12)


def _run(folder: Path, script: list[tuple[str, object]], pane_lines: int, shards: int,
         early: str) -> int:
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
                                     pane_lines=pane_lines, early=early)
    return n


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps, pane_lines=st.integers(1, 4), shards=st.integers(1, 3),
       early=st.sampled_from([BY_COUNT_OR_TIME, AT_END]))
def test_every_output_is_written_once_whatever_its_event_time(
        tmp_path_factory: object, script: list[tuple[str, object]], pane_lines: int,
        shards: int, early: str) -> None:
    folder = tmp_path_factory.mktemp("write")  # type: ignore[attr-defined]
    n = _run(folder, script, pane_lines, shards, early)
    files = sorted(folder.iterdir())
    name = re.compile(r"late-[0-9a-f]{12}-p\d{4,}-s\d{3}\.jsonl")  # job token, pane, shard
    assert all(name.fullmatch(f.name) for f in files), files
    ids = [json.loads(line)["join_id"] for f in files for line in f.read_text().splitlines()]
    assert sorted(ids) == sorted(f"j{i}" for i in range(n))
    for f in files:  # no empty file, lines sorted
        lines = f.read_text().splitlines()
        assert lines and lines == sorted(lines)
    if early == AT_END:  # one file per shard with lines, when the stream ends
        assert len(files) <= shards and all("-p0000-" in f.name for f in files)


def _files_by_pane(folder: Path, early: str, rounds: int, per_round: int,
                   pane_lines: int = 10_000) -> list[list[str]]:
    """``rounds`` batches of outputs, processing time advanced 5 s after each, through the
    streaming write with a 2 s ``window_s``; the join ids of each file, in pane order."""
    stream = test_stream.TestStream()
    for r in range(rounds):
        stream.add_elements([TimestampedValue({"join_id": f"r{r}-{i}"}, Timestamp(10 + r))
                             for i in range(per_round)])
        stream.advance_processing_time(5)
    stream.advance_watermark_to_infinity()
    options = PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    with beam.Pipeline(options=options) as p:
        _ = p | stream | WriteOutput(str(folder), "closes", streaming=True, window_s=2,
                                     pane_lines=pane_lines, early=early)
    return [[json.loads(line)["join_id"] for line in f.read_text().splitlines()]
            for f in sorted(folder.iterdir())]


def test_by_time_writes_a_file_every_window_on_the_local_runner(tmp_path: Path) -> None:
    # each round's outputs are written once its window passed, not held for the end of input
    assert _files_by_pane(tmp_path, BY_TIME, rounds=4, per_round=3) == [
        [f"r{r}-{i}" for i in range(3)] for r in range(4)]


def test_at_end_writes_each_shard_once_when_the_stream_ends(tmp_path: Path) -> None:
    # whatever the windows and counts that passed, one sorted file per shard, pane 0, named by
    # the job token; no temporary file is left behind
    files = _files_by_pane(tmp_path, AT_END, rounds=3, per_round=4, pane_lines=2)
    assert files == [sorted(f"r{r}-{i}" for r in range(3) for i in range(4))]
    assert [re.fullmatch(r"closes-[0-9a-f]{12}-p0000-s000\.jsonl", f.name) is not None
            for f in tmp_path.iterdir()] == [True]


def test_count_or_time_fires_its_time_branch_once_on_the_local_runner(tmp_path: Path) -> None:
    # Beam 2.77's Python trigger code (apache/beam#21262): why live local runs use BY_TIME.
    # If this starts failing, Beam fixed it and BY_COUNT_OR_TIME can serve every runner.
    files = _files_by_pane(tmp_path, BY_COUNT_OR_TIME, rounds=3, per_round=2)
    assert files == [["r0-0", "r0-1"], ["r1-0", "r1-1", "r2-0", "r2-1"]]


def test_the_early_firing_follows_the_runner_and_the_input() -> None:
    live = RunConfig(output="out", subscription="projects/p/subscriptions/s")
    replay = RunConfig(output="out", inputs=["in.jsonl"], replay=True)
    assert early_firing(live, "BundleBasedDirectRunner") == BY_TIME
    assert early_firing(live, "SwitchingDirectRunner") == BY_TIME
    for runner in ("DataflowRunner", "FlinkRunner", "PrismRunner"):
        assert early_firing(live, runner) == BY_COUNT_OR_TIME
    for runner in ("BundleBasedDirectRunner", "PrismRunner", "FlinkRunner"):
        assert early_firing(replay, runner) == AT_END


def test_an_unknown_early_firing_is_refused() -> None:
    with pytest.raises(ValueError, match="early must be one of"):
        WriteOutput("out", "closes", streaming=True, early="sometimes")
