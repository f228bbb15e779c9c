"""Beam composite: write one output (closes, late or dead_letter) as files under a folder.

Guarantees:
- Files are newline-delimited JSON (``*.jsonl``), and Parquet as well (or instead) when asked,
  in ``OUTPUT/<kind>/``. Each file is written under a temporary name and renamed into place,
  so a crash never leaves a half-written file that looks complete; a retried bundle rewrites
  the same name with the same content.
- Lines within a file are sorted, so the same input gives byte-identical files.
- Streaming: outputs are grouped in fixed event-time windows (``window_s``); a window's file is
  written when the watermark passes its end, and late outputs (a late record's event time is
  behind the watermark) produce a further pane file instead of being dropped: allowed lateness
  is ``allowed_lateness_s`` (default ten years), so nothing the join emits is dropped.
  File names carry the window and the pane index.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
import orjson
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms import trigger, window
from apache_beam.utils.timestamp import Duration

from fanin.contracts.timefmt import format_ms
from fanin.io.files import atomic_write

__all__ = ["FORMATS", "WriteOutput"]

FORMATS = ("jsonl", "parquet")
_TEN_YEARS_S = 10 * 366 * 86400


def _window_label(win: Any) -> str:
    if isinstance(win, window.IntervalWindow):
        start = format_ms(win.start.micros // 1000).replace(":", "")
        return f"w{start}"
    return "all"


class _WriteFiles(beam.DoFn):
    def __init__(self, folder: str, kind: str, formats: Sequence[str]) -> None:
        self._folder = folder
        self._kind = kind
        self._formats = tuple(formats)

    def process(self, element: tuple[int, Iterable[str]], win: Any = beam.DoFn.WindowParam,
                pane: Any = beam.DoFn.PaneInfoParam) -> Iterable[str]:
        shard, lines = element
        ordered = sorted(lines)
        if not ordered:
            return
        base = f"{self._kind}-{_window_label(win)}-p{pane.index:04d}-s{shard:03d}"
        written = []
        if "jsonl" in self._formats:
            path = FileSystems.join(self._folder, base + ".jsonl")
            data = ("\n".join(ordered) + "\n").encode("utf-8")
            atomic_write(path, lambda handle: handle.write(data))
            written.append(path)
        if "parquet" in self._formats:
            from fanin.analysis.tables import write_parquet

            written.extend(write_parquet(self._kind, [json.loads(x) for x in ordered],
                                         self._folder, base))
        yield from written


def _encode(obj: dict[str, Any], shards: int) -> tuple[int, str]:
    """(shard by join_id, compact JSON line). orjson, or the standard encoder for what orjson
    refuses (integers beyond 64 bits); both give the same compact UTF-8 JSON."""
    shard = zlib.crc32((obj.get("join_id") or "").encode()) % shards
    try:
        return shard, orjson.dumps(obj).decode()
    except TypeError:
        return shard, json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class WriteOutput(beam.PTransform):
    """Dicts -> files in ``folder``; outputs the paths written."""

    def __init__(self, folder: str, kind: str, formats: Sequence[str] = ("jsonl",),
                 streaming: bool = False, window_s: float = 60.0, shards: int = 1,
                 allowed_lateness_s: float = _TEN_YEARS_S) -> None:
        super().__init__()
        unknown = set(formats) - set(FORMATS)
        if unknown or not formats:
            raise ValueError(f"formats must be a non-empty subset of {FORMATS}")
        if window_s <= 0 or shards < 1:
            raise ValueError("window_s must be > 0 and shards >= 1")
        self._folder, self._kind, self._formats = folder, kind, tuple(formats)
        self._streaming, self._window_s, self._shards = streaming, window_s, shards
        self._lateness = allowed_lateness_s

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        if self._streaming:
            pcoll = pcoll | "Window" >> beam.WindowInto(
                window.FixedWindows(self._window_s),
                trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                accumulation_mode=trigger.AccumulationMode.DISCARDING,
                allowed_lateness=Duration(seconds=self._lateness))
        return (
            pcoll
            | "Encode" >> beam.Map(_encode, self._shards).with_output_types(tuple[int, str])
            | "GroupShards" >> beam.GroupByKey()
            | "WriteFiles" >> beam.ParDo(_WriteFiles(self._folder, self._kind, self._formats))
        )
