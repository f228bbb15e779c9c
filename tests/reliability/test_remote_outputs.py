"""Outputs to a remote folder stay remote, for every output and format, in
bounded and streaming runs. The remote store is ``fanintest://`` (``remotefs.py``), a Beam
filesystem that is not the local one; before the fix, Parquet went to a local ``fanintest:``
folder (``pathlib`` turned ``fanintest://out`` into ``fanintest:/out``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanin.pipelines.pipeline import RunConfig, run_pipeline
from tests.reliability.remotefs import RemoteTestFileSystem
from tests.reliability.runs import KINDS, parquet_rows, read_jsonl, run_cli, write_lines

LINES = [
    '{"kind":"open","join_id":"j1","opened_at":"2026-01-01T00:00:00Z","required":["a"]}',
    '{"join_id":"j1","branch":"a","status":"ok","event_time":"2026-01-01T00:00:01Z",'
    '"value":{"n":1}}',
    '{"join_id":"j1","branch":"a","status":"ok","event_time":"2026-01-01T00:00:09Z",'
    '"value":{"n":2}}',  # after the eager close: late
    '{"join_id":"j2","branch":"a","status":"ok","event_time":"2026-01-02T00:00:00Z"}',
    "not json",
]


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    """Lines per output of the same input written to a local folder."""
    found = run_cli(LINES, tmp_path_factory.mktemp("local"))
    counts = {kind: len(found[kind]) for kind in KINDS}
    assert all(counts.values()), counts  # every output is exercised
    return counts


@pytest.mark.parametrize("formats", [("jsonl",), ("parquet",), ("jsonl", "parquet")])
@pytest.mark.parametrize("replay", [False, True], ids=["bounded", "replay"])
def test_every_output_and_format_is_written_to_the_remote_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, expected: dict[str, int],
        formats: tuple[str, ...], replay: bool) -> None:
    root, cwd = tmp_path / "store", tmp_path / "cwd"
    root.mkdir()
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # a path mistaken for a local one would land here
    monkeypatch.setattr(RemoteTestFileSystem, "root", root)
    traffic = write_lines(tmp_path / "traffic.jsonl", LINES)
    run_pipeline(RunConfig(output="fanintest://bucket/out", inputs=[str(traffic)],
                           formats=formats, replay=replay), [])
    assert list(cwd.iterdir()) == []
    out = root / "bucket" / "out"
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    if "jsonl" in formats:
        assert {k: len(v) for k, v in read_jsonl(out).items()} == expected
    if "parquet" in formats:
        assert parquet_rows(out) == expected
        assert [p.parent.name for p in (out / "closes").rglob("*.parquet")] == [
            "close_date=2026-01-01"]
    else:
        assert not list(out.rglob("*.parquet"))
