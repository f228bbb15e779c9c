"""The bounded write's finalize is safe to retry after a partial success, as
Beam's file sinks' finalize is: a final file in place with its temporary files gone counts as
done. Each case runs the finalize, makes an attempt fail part-way (a fault injected in the
cleanup), retries it with the same input, and compares with an uninterrupted finalize; on the
local filesystem and on a remote one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from apache_beam.io.filesystems import FileSystems

from fanin.contracts.catalog import Catalog
from fanin.contracts.parsing import parse_message
from fanin.core.bounded import bounded_outputs
from fanin.transforms import write
from fanin.transforms.write import _Finalize, _SpillBundles
from tests.reliability.remotefs import PREFIX, RemoteTestFileSystem

Spills = list[tuple[int, str]]


class Crash(Exception):
    """The injected fault: the worker dies in the middle of the cleanup."""


@pytest.fixture(params=["local", "remote"])
def place(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """(the folder as the pipeline names it, the same folder on local disk)."""
    if request.param == "local":
        return str(tmp_path), tmp_path
    monkeypatch.setattr(RemoteTestFileSystem, "root", tmp_path)
    return PREFIX + "out", tmp_path / "out"


def _spill(folder: str, kind: str, objs: list[dict[str, Any]]) -> Spills:
    spill = _SpillBundles(folder, kind, 1, "tok")
    spill.start_bundle()
    for obj in objs:
        spill.process(obj)
    return [wv.value for wv in spill.finish_bundle()]


def _finalize(folder: str, kind: str, spills: Spills, formats: tuple[str, ...]) -> list[str]:
    return list(_Finalize(folder, kind, formats, "tok").process((0, [p for _, p in spills])))


def _close(n: int) -> dict[str, Any]:
    """A real close of join ``j<n>`` (closed on 2026-01-01 or 2026-01-02), from the core."""
    day = 1 + n % 2
    lines = [f'{{"kind":"open","join_id":"j{n}","opened_at":"2026-01-0{day}T00:00:00Z",'
             '"required":["a"]}',
             f'{{"join_id":"j{n}","branch":"a","status":"ok","event_time":'
             f'"2026-01-0{day}T00:00:01Z","value":{{"n":{n}}}}}']
    records = [parse_message(line.encode(), ("f", i), {})[0] for i, line in enumerate(lines)]
    ((kind, obj),) = bounded_outputs(records, Catalog({}), 100, 2**30)
    assert kind == "closes"
    return obj


def _files(disk: Path) -> dict[str, bytes]:
    return {p.relative_to(disk).as_posix(): p.read_bytes()
            for p in sorted(disk.rglob("*")) if p.is_file()}


def _crash_in_cleanup(monkeypatch: pytest.MonkeyPatch, deleted: int) -> None:
    """The next cleanup deletes ``deleted`` files, then the worker dies."""
    real = FileSystems.delete

    def delete(paths: list[str]) -> None:
        monkeypatch.setattr(write.FileSystems, "delete", real)
        real(sorted(paths)[:deleted])
        raise Crash

    monkeypatch.setattr(write.FileSystems, "delete", delete)


CASES = [  # (kind, formats, bundles): one bundle is renamed into place, several are merged
    ("closes", ("jsonl",), 1), ("closes", ("jsonl",), 3), ("closes", ("jsonl", "parquet"), 1),
    ("closes", ("parquet", "jsonl"), 2)]


@pytest.mark.parametrize(("kind", "formats", "bundles"), CASES)
@pytest.mark.parametrize("deleted", [0, 1])
def test_a_retried_finalize_after_a_partial_success_completes_it(
        place: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch, kind: str, formats: tuple[str, ...], bundles: int,
        deleted: int) -> None:
    folder, disk = place
    objs = [_close(n) for n in range(6)]
    # the uninterrupted finalize, for comparison (local)
    ref = tmp_path_factory.mktemp("ref")
    want = _finalize(str(ref), kind, [s for b in range(bundles)
                                      for s in _spill(str(ref), kind, objs[b::bundles])],
                     formats)
    spills = [s for b in range(bundles) for s in _spill(folder, kind, objs[b::bundles])]
    _spill(folder, kind, objs[:1])  # a failed bundle attempt's spill: not reported, deleted
    _crash_in_cleanup(monkeypatch, deleted)
    with pytest.raises(Crash):
        _finalize(folder, kind, spills, formats)
    retried = _finalize(folder, kind, spills, formats)
    again = _finalize(folder, kind, spills, formats)  # and once more: still nothing to do
    assert _files(disk) == _files(ref)
    assert [p.rsplit("/", 1)[-1] for p in retried] == [p.rsplit("/", 1)[-1] for p in want]
    assert retried == again


def test_a_finalize_whose_files_are_all_gone_fails_loudly(tmp_path: Path) -> None:
    spills = _spill(str(tmp_path), "late", [_close(1)])
    Path(spills[0][1]).unlink()
    with pytest.raises(FileNotFoundError, match="output files are not there"):
        _finalize(str(tmp_path), "late", spills, ("jsonl",))
