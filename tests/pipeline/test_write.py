"""The bounded two-phase file write: bundles spill sorted temporary files, one step finalizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

import fanin.transforms.write as write
from fanin.transforms.write import _encode, _Finalize, _SpillBundles, _temp_prefix


def _spill(folder: Path, objs: list[dict[str, Any]], shards: int) -> list[tuple[int, str]]:
    """One bundle of the first phase, run by hand; its ``(shard, temporary path)`` outputs."""
    spill = _SpillBundles(str(folder), "late", shards, "tok")
    spill.start_bundle()
    for obj in objs:
        spill.process(obj)
    return [wv.value for wv in spill.finish_bundle()]


def _finalize(folder: Path, runs: list[tuple[int, str]], formats: tuple[str, ...]
              ) -> list[str]:
    """The second phase as the pipeline runs it: one call per shard with its paths."""
    finalize = _Finalize(str(folder), "late", formats, "tok")
    return [path for shard in sorted({s for s, _ in runs})
            for path in finalize.process((shard, [p for s, p in runs if s == shard]))]


def _late(n: int) -> dict[str, Any]:
    return {"join_id": f"j{n:03d}", "reason": "after_close", "close_reason": "complete",
            "message": {"text": "line\u2028separator", "n": n}}


def test_bundles_merge_per_shard_and_no_temporary_file_is_left(tmp_path: Path) -> None:
    objs = [_late(n) for n in range(40)]
    first, second = _spill(tmp_path, objs[::2], 2), _spill(tmp_path, objs[1::2], 2)
    assert {shard for shard, _ in first} == {shard for shard, _ in second} == {0, 1}
    assert all(Path(p).name.startswith(_temp_prefix("late", "tok", s)) and ".tmp-" in p and
               not p.endswith(".jsonl") for s, p in first + second)
    orphan = tmp_path / f"{_temp_prefix('late', 'tok', 0)}failed-attempt.tmp-lines"
    orphan.write_text("not a line of this run\n")
    other_run = tmp_path / f"{_temp_prefix('late', 'other', 0)}x.tmp-lines"
    other_run.write_text("kept\n")
    # shard 0 from both bundles (merged), shard 1 from the first only (renamed into place);
    # the second bundle's shard-1 file stands for a failed attempt's output, like the orphan
    runs = [*first, *[sp for sp in second if sp[0] == 0]]
    written = _finalize(tmp_path, runs, ("jsonl",))
    assert [Path(p).name for p in written] == ["late-all-p0000-s000.jsonl",
                                               "late-all-p0000-s001.jsonl"]
    expected = {0: sorted(_encode(o, 2)[1] for o in objs if _encode(o, 2)[0] == 0),
                1: sorted(_encode(o, 2)[1] for o in objs[::2] if _encode(o, 2)[0] == 1)}
    for shard, path in enumerate(written):
        assert Path(path).read_bytes() == ("\n".join(expected[shard]) + "\n").encode()
    assert json.loads(expected[0][0])["message"]["text"] == "line\u2028separator"
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([other_run.name, "late-all-p0000-s000.jsonl",
                           "late-all-p0000-s001.jsonl"])


def test_many_temporary_files_are_merged_a_few_at_a_time(tmp_path: Path,
                                                         monkeypatch: Any) -> None:
    """A shard spilled by more bundles than a merge may open at once (a replay spills a file
    per bundle): merged in rounds of at most ``MERGE_FAN_IN`` files, the output the same."""
    monkeypatch.setattr(write, "MERGE_FAN_IN", 3)
    widest: list[int] = []
    merge = write._merge_into
    monkeypatch.setattr(write, "_merge_into", lambda paths, out: (
        widest.append(len(paths)), merge(paths, out))[1])
    objs = [_late(n) for n in range(40)]
    runs = [run for n in range(10) for run in _spill(tmp_path, objs[n::10], 1)]
    written = _finalize(tmp_path, runs, ("jsonl",))
    assert Path(written[0]).read_bytes() == (
        "\n".join(sorted(_encode(o, 1)[1] for o in objs)) + "\n").encode()
    assert len(runs) == 10 and max(widest) == 3 and len(widest) == 3 + 1 + 1  # 10 -> 4 -> 2
    assert [p.name for p in tmp_path.iterdir()] == ["late-all-p0000-s000.jsonl"]


def test_parquet_is_written_from_the_merged_lines(tmp_path: Path) -> None:
    objs = [_late(n) for n in range(6)]
    runs = _spill(tmp_path, objs, 1)
    written = _finalize(tmp_path, runs, ("jsonl", "parquet"))
    parquet = [p for p in written if p.endswith(".parquet")]
    assert len(parquet) == 1 and pq.read_table(parquet[0]).num_rows == len(objs)
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


def test_dead_letters_spread_over_the_shards() -> None:
    """``--shards`` splits dead letters too (by their message: they have no join_id); all went
    to shard 0."""
    letters = [{"error": "invalid_json", "detail": "d", "raw": f"not json {i}"}
               for i in range(40)]
    assert {_encode(letter, 3)[0] for letter in letters} == {0, 1, 2}
    closes = [{"join_id": f"j{i}", "reason": "complete"} for i in range(40)]
    assert {_encode(close, 3)[0] for close in closes} == {0, 1, 2}
    assert {_encode(close, 1)[0] for close in closes + letters} == {0}
