"""Python's garbage collector while a job runs in this process.

A local runner keeps the job's state in this process as Python objects (the streaming
runner copies a key's state and timers on every bundle that touches the key), so the live
heap is large and much of it survives the young collections. Each *full* collection walks
every live object: with Python's default thresholds ``(700, 10, 10)`` the 206,728-line
replay of docs/performance.md ran 40 of them, a quarter of its CPU time. ``collector_for_run``
raises only the third threshold (a full collection after 100 middle ones instead of 10):
cyclic garbage is still collected, and Python still runs a full collection only once the
objects waiting for one are a quarter of the long-lived heap.

Guarantees: outputs do not depend on it (no object the job holds is freed by it); the
thresholds in force before are restored when the run ends, however it ends.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["RUN_THRESHOLDS", "collector_for_run"]

# (young, middle, full): Python's defaults but the last, 10 -> 100
RUN_THRESHOLDS = (700, 10, 100)


@contextlib.contextmanager
def collector_for_run() -> Iterator[None]:
    """``RUN_THRESHOLDS`` in force inside the block; the previous ones restored after it."""
    before = gc.get_threshold()
    gc.set_threshold(*RUN_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
