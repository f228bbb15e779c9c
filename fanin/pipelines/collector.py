"""Python's garbage collector while a job runs in this process.

A local runner keeps the job's state in this process as Python objects (the streaming
runner copies a key's state and timers on every bundle that touches the key), so the live
heap is large and much of it survives the young collections. Each *full* collection walks
every live object: with Python's default thresholds ``(700, 10, 10)`` the 206,728-line
replay of docs/performance.md ran 40 of them, a quarter of its CPU time (~0.3 s each).
``collector_for_run`` raises only the third threshold (a full collection after 1,000 middle
ones instead of 10): young and middle collections still free cyclic garbage as before, and
full ones still run, about every 7 million net allocations (that replay: none, against 6
with a threshold of 100, which cost 1.8 s; peak RSS 504 MB against 493).

Guarantees: outputs do not depend on it (no object the job holds is freed by it); the
thresholds in force before the first of overlapping runs (several threads) are restored when
the last of them ends, however it ends.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["RUN_THRESHOLDS", "collector_for_run"]

# (young, middle, full): Python's defaults but the last, 10 -> 1,000
RUN_THRESHOLDS = (700, 10, 1000)


class _Runs:
    """The runs inside ``collector_for_run`` now, and the thresholds before the first."""

    lock = threading.Lock()
    inside = 0
    before = gc.get_threshold()


@contextlib.contextmanager
def collector_for_run() -> Iterator[None]:
    """``RUN_THRESHOLDS`` in force inside the block; the previous ones restored once no block
    is open (blocks may overlap: runs on several threads)."""
    with _Runs.lock:
        if not _Runs.inside:
            _Runs.before = gc.get_threshold()
            gc.set_threshold(*RUN_THRESHOLDS)
        _Runs.inside += 1
    try:
        yield
    finally:
        with _Runs.lock:
            _Runs.inside -= 1
            if not _Runs.inside:
                gc.set_threshold(*_Runs.before)
