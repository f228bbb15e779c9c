"""Replay files as a deterministic stream on the local runner (``fanin run --replay``).

Guarantees:
- Lines are delivered in file order (file order = arrival order), each stamped with its event
  time (an open's ``opened_at``, a receipt's ``event_time``); a line whose event time cannot be
  read is stamped with the current watermark, so it is never dropped as late by the source.
- The watermark trails the largest event time seen so far by ``max_disorder_s``; it only moves
  forward, and is advanced at most once per ``step_ms`` of event time (and at the latest every
  ``batch`` lines), so a replay is deterministic and cheap.
- Before the stream ends the watermark is advanced past every timer the join can set (largest
  event time + the largest deadline and retention in play), so every close, late line and
  tombstone expiry happens inside the stream (docs/beam-notes.md: output of timers fired only by the
  final jump to +infinity is lost on the BundleBasedDirectRunner).
- The stream's elements and its output PCollection use one portable coder
  (``KV<bytes, KV<string, varint>>``): a Java runner (Flink) decodes the TestStream payload
  itself, so a Python-only (pickled) coder would fail there, and the Python workers read the
  PCollection with the same coder the runner wrote (docs/runners.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from apache_beam.coders import BytesCoder, StrUtf8Coder, TupleCoder, VarIntCoder
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from fanin.contracts.timefmt import MAX_MS, duration_ms, parse_rfc3339

__all__ = ["build_replay", "scan_line"]


def scan_line(line: bytes) -> tuple[int | None, int]:
    """Best-effort ``(event time ms or None, open's deadline ms or 0)`` of a raw line."""
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict):
            return None, 0
        is_open = obj.get("kind") == "open"
        text = obj.get("opened_at") if is_open else obj.get("event_time")
        deadline = obj.get("deadline_s") if is_open else None
        extra = duration_ms(deadline) if isinstance(deadline, (int, float)) and \
            not isinstance(deadline, bool) and deadline > 0 else 0
        return (parse_rfc3339(text) if isinstance(text, str) else None), extra
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, 0


# (line, (path, line number)): every component a standard coder Java runners know
ELEMENT_CODER = TupleCoder([BytesCoder(), TupleCoder([StrUtf8Coder(), VarIntCoder()])])
ELEMENT_TYPE = tuple[bytes, tuple[str, int]]  # Beam infers the coder from it


def _stamp(ms: int) -> Timestamp:
    return Timestamp(micros=ms * 1000)


def build_replay(lines: Iterable[tuple[bytes, dict[str, Any]]], max_disorder_s: float,
                 horizon_ms: int, step_ms: int = 1000, batch: int = 1000) -> TestStream:
    """A TestStream of ``(line, source)`` elements; ``horizon_ms``: deadline + retention room.

    The final watermark advance also covers the longest ``deadline_s`` of any open replayed.
    """
    stream = TestStream(coder=ELEMENT_CODER)
    lag = int(max_disorder_s * 1000)
    watermark: int | None = None
    max_seen: int | None = None
    pending: list[Any] = []
    longest = 0

    def flush(advance_to: int | None) -> None:
        nonlocal watermark
        if pending:
            stream.add_elements(list(pending))
            pending.clear()
        if advance_to is not None and (watermark is None or advance_to > watermark):
            stream.advance_watermark_to(_stamp(advance_to))
            watermark = advance_to

    for line, source in lines:
        t, deadline_ms = scan_line(line)
        longest = max(longest, deadline_ms)
        if t is not None and (max_seen is None or t > max_seen):
            max_seen = t
        target = None if max_seen is None else max_seen - lag
        if target is not None and watermark is not None and target - watermark >= step_ms:
            # the earlier lines first, then the watermark moves up to this one (every timer
            # it passes fires before this line arrives, as on a live source)
            flush(target)
        stamp = t if t is not None else (watermark if watermark is not None else max_seen or 0)
        pending.append(TimestampedValue((line, source), _stamp(stamp)))
        if watermark is None or len(pending) >= batch:
            flush(target)
    # deadlines are capped at the end of year 9999, so no timer is later than that + horizon
    final = min((max_seen or 0) + longest, MAX_MS) + horizon_ms + 1
    flush(None)
    stream.advance_watermark_to(_stamp(max(final, watermark or final)))
    return stream.advance_watermark_to_infinity().with_output_types(ELEMENT_TYPE)
