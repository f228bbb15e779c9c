"""Streaming output file names carry the job's token: a replacement job
(drain, then launch) writing to the same folder never overwrites the earlier job's files, and
within a job the names are fixed when the job is built, so a retried bundle rewrites its own
file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import PipelineVisitor
from support.dataflow_jobs import example_config

from fanin.pipelines.pipeline import build, catalog_for
from fanin.transforms.write import WriteOutput


def _streaming_job(folder: Path, join_ids: list[str]) -> None:
    """One streaming job writing ``late`` lines for ``join_ids`` to ``folder``."""
    options = PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    with beam.Pipeline(options=options) as p:
        _ = (p | beam.Create([{"join_id": j, "reason": "after_close"} for j in join_ids])
             | WriteOutput(str(folder), "late", streaming=True))


def _lines(folder: Path) -> dict[str, list[str]]:
    return {f.name: f.read_text().splitlines() for f in sorted(folder.iterdir())}


def test_a_replacement_job_keeps_the_earlier_jobs_files(tmp_path: Path) -> None:
    _streaming_job(tmp_path, ["j1", "j2"])
    first = _lines(tmp_path)
    _streaming_job(tmp_path, ["j3"])  # the job launched after the first was drained
    second = _lines(tmp_path)
    assert {name: second[name] for name in first} == first  # nothing overwritten
    ids = sorted(json.loads(x)["join_id"] for lines in second.values() for x in lines)
    assert ids == ["j1", "j2", "j3"]
    pattern = re.compile(r"late-([0-9a-f]{12})-p(\d{4})-s(\d{3})\.jsonl")
    tokens = {pattern.fullmatch(name).group(1) for name in second}  # type: ignore[union-attr]
    assert len(tokens) == 2


class _Writers(PipelineVisitor):
    def __init__(self) -> None:
        self.fns: dict[str, beam.DoFn] = {}

    def visit_transform(self, node: object) -> None:
        if node.full_label.endswith("/WriteFiles"):  # type: ignore[attr-defined]
            self.fns[node.full_label] = node.transform.fn  # type: ignore[attr-defined]


def test_one_token_per_job_fixed_in_the_pickled_fns() -> None:
    """Every output of one streaming job shares its token; the workers' copies (unpickled, as
    on each retry) name files with the same token."""
    config = example_config(True)
    p = beam.Pipeline(options=PipelineOptions(["--runner=BundleBasedDirectRunner",
                                               "--streaming"]))
    build(p, config, catalog_for(config))
    writers = _Writers()
    p.visit(writers)
    assert sorted(writers.fns) == [f"Write/{k}/WriteFiles" for k in
                                   ("closes", "dead_letter", "late")]
    tokens = {fn._token for fn in writers.fns.values()}
    assert len(tokens) == 1
    assert {pickler.loads(pickler.dumps(fn))._token for fn in writers.fns.values()} == tokens


def test_a_token_must_be_safe_in_a_file_name() -> None:
    for bad in ("a/b", "a-b", "", "é1"):
        with pytest.raises(ValueError, match="token must be letters and digits"):
            WriteOutput("out", "late", streaming=True, token=bad)
