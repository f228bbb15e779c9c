"""The bounded write's spill (fanin.transforms.write): a bundle writes a shard's lines in
sorted temporary files of at most ``spill_chars`` characters each, and the finalize merges
them into the same bytes as one sorted file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fanin.transforms.write import _encode, _Finalize, _SpillBundles


def _objects(n: int) -> list[dict[str, Any]]:
    # in no sorted order; two are equal; texts of several lengths, one a prefix of another,
    # and characters beyond ASCII (sorted by code point, as the merge compares UTF-8 bytes)
    texts = ["b", "ba", "a\u00e9", "a\U0001f600", "a~", "a\u2028b"]
    objs = [{"join_id": f"j{(i * 7919) % 97:02d}", "error": "x",
             "detail": texts[i % 6] * (i % 3 + 1)} for i in range(n)]
    return [*objs, objs[5]]


def _run(folder: Path, objs: list[dict[str, Any]], spill_chars: int) -> tuple[int, Path]:
    spill = _SpillBundles(str(folder), "dead_letter", 1, "tok", spill_chars=spill_chars)
    spill.start_bundle()
    for obj in objs:
        spill.process(obj)
    spilled = [wv.value for wv in spill.finish_bundle()]
    (written,) = _Finalize(str(folder), "dead_letter", ("jsonl",), "tok").process(
        (0, [path for _, path in spilled]))
    assert sorted(p.name for p in folder.iterdir()) == [Path(written).name]
    return len(spilled), Path(written)


def test_a_bundle_spills_sorted_files_that_merge_into_the_one_file_bytes(tmp_path: Path
                                                                         ) -> None:
    objs = _objects(300)
    lines = [_encode(obj, 1)[1] for obj in objs]
    expected = ("\n".join(sorted(lines)) + "\n").encode("utf-8")
    whole, one = _run(tmp_path / "whole", objs, 2**40)
    assert whole == 1 and one.read_bytes() == expected
    longest = max(len(line) for line in lines)
    parts, merged = _run(tmp_path / "parts", objs, 10 * longest)
    assert parts >= sum(map(len, lines)) // (11 * longest) > 10  # it spilled per chunk
    assert merged.read_bytes() == expected
