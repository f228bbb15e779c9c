"""A problem of a Pub/Sub step, counted by every copy of its DoFn and logged with counts.

The local runner runs each bundle with a fresh copy of a step's DoFn, on several threads, so
a report is shared by the copies in a process (the step keeps it by a key of its own).

Guarantees of ``CountedReport``: every ``count`` is in the ``fanin/<metric>`` counter and in
``total``; ``report`` logs one warning with the total and the count since the last warning —
at the first call that has any, then at most once every ``EVERY_S`` (a minute) while more
come, and always when ``final`` (the run's end) if any are unreported. Counting and reporting
are safe from several threads.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from typing import Any

from apache_beam.metrics.metric import Metrics

__all__ = ["CountedReport"]


class CountedReport(ABC):
    """See the module. A subclass says how a new occurrence's ``detail`` folds into what
    the next warning shows (``_fold``) and writes the warning (``_log``)."""

    EVERY_S = 60.0

    def __init__(self, metric: str) -> None:
        self.total = 0
        self._unreported = 0
        self._detail: Any = None  # the fold of the details counted so far (None: none yet)
        self._reported_at: float | None = None
        self._counter = Metrics.counter("fanin", metric)
        self._lock = threading.Lock()

    def count(self, detail: Any) -> None:
        """One more occurrence, with what the warning may say of it."""
        with self._lock:
            self.total += 1
            self._unreported += 1
            self._detail = detail if self._detail is None else self._fold(self._detail, detail)
        self._counter.inc()

    def report(self, final: bool = False, reset: bool = False) -> None:
        """Log the counts unless nothing is new or (not ``final``) the last warning is less
        than ``EVERY_S`` old; ``reset``: count ``total`` afresh after it (a run ended)."""
        now = time.monotonic()
        with self._lock:
            total, unreported, detail = self.total, self._unreported, self._detail
            if reset:
                self.total = 0
            if not unreported or (not final and self._reported_at is not None
                                  and now - self._reported_at < self.EVERY_S):
                return
            self._unreported = 0
            self._reported_at = now
        self._log(total, unreported, detail)

    @staticmethod
    @abstractmethod
    def _fold(earlier: Any, detail: Any) -> Any:
        """What the warning shows of ``earlier`` (the fold so far) and a new ``detail``."""

    @abstractmethod
    def _log(self, total: int, unreported: int, detail: Any) -> None:
        """The warning."""
