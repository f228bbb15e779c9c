"""What both join plans share (``fanin.transforms.join``): their outputs, emitted and counted
per bundle (``_Counting``), and the poison guard around the core (``_core``): an exception the
core raises for one join becomes ``_JoinFailed``, and that join's records become
``internal_error`` dead letters (``_internal_errors``) while the run goes on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics.metric import Metrics

from fanin.contracts import records as R
from fanin.core.outcomes import CLOSES, DEAD_LETTER, log_close, rejected_outputs

__all__ = ["DEFAULT_MAX_BYTES_PER_JOIN"]

_LOG = logging.getLogger("fanin.transforms.join")
_T = TypeVar("_T")
_INTERNAL = "internal_error"
# Dataflow refuses elements over ~80 MB and key commits over ~180 MB. A record in state takes
# ~4x its message's bytes (text, parsed value, canonical JSON: measured 3.8-4.0x), and a close
# carries its accepted values: 16 MiB of messages keeps a join's bag additions plus its close
# under ~85 MiB in one commit even when all its messages arrive in one bundle.
DEFAULT_MAX_BYTES_PER_JOIN = 16 * 1024 * 1024

_PROGRESS_EVERY = 10_000
_closed_here = 0  # closes emitted by this worker process, for the progress line
_LATENCY = Metrics.distribution("fanin", "close.latency_ms")


@functools.lru_cache(maxsize=256)
def _counter(name: str) -> Any:
    return Metrics.counter("fanin", name)


class _JoinFailed(Exception):
    """The core raised for one join (the original exception is the cause)."""


def _core(call: Callable[..., _T], *args: Any) -> _T:
    """``call(*args)`` (folding, deciding or encoding one join); any exception it raises
    becomes ``_JoinFailed``, which poisons that join only."""
    try:
        return call(*args)
    except _JoinFailed:
        raise
    except Exception as exc:
        raise _JoinFailed(exc) from exc


def _all(produce: Callable[..., Iterable[_T]], *args: Any) -> list[_T]:
    """Every item ``produce(*args)`` yields (for ``_core``: built whole, or not at all)."""
    return list(produce(*args))


def _internal_errors(cause: BaseException | None, records: Iterable[R.Record]
                     ) -> list[tuple[str, dict[str, Any]]]:
    """The ``internal_error`` dead letters of a poisoned join's records; ``cause``: what the
    core raised (the ``on_error`` of ``fanin.core.bounded.bounded_outputs``)."""
    first = (str(cause).splitlines() or [""])[0][:200]
    detail = f"{type(cause).__name__}: {first}" if first else type(cause).__name__
    _LOG.warning("fanin: a join failed in the core (%s); its records go to dead_letter",
                 type(cause).__name__)
    return list(rejected_outputs(records, _INTERNAL, detail))


class _Counting(beam.DoFn):
    """A DoFn whose outputs are counted per bundle: ``_emit`` tallies them and the tally goes
    to the Beam counters ``closes.<reason>``, ``late.<reason>``, ``dead_letter.<error>`` once,
    in ``finish_bundle`` (a counter update per element costs as much as folding a join).
    Closes are logged (``fanin.close``) only when ``_log_closes`` (``--log-closes``): workers
    log at INFO, so the logger's level alone would log every close to Cloud Logging."""

    _log_closes = False

    def start_bundle(self) -> None:
        self._tally: dict[tuple[str, str], int] = {}

    def finish_bundle(self) -> Iterable[Any] | None:  # a subclass may emit (WindowedValues)
        for (tag, reason), count in self._tally.items():
            _counter(f"{tag}.{reason}").inc(count)
        self._tally = {}
        return None

    def _emit(self, outputs: Iterable[tuple[str, dict[str, Any]]]) -> Iterator[Any]:
        global _closed_here
        tally = self._tally
        for tag, obj in outputs:
            reason = obj["error"] if tag == DEAD_LETTER else obj["reason"]
            tally[tag, reason] = tally.get((tag, reason), 0) + 1
            if tag == CLOSES:
                _LATENCY.update(obj["latency_ms"])
                if self._log_closes:
                    log_close(obj)
                _closed_here += 1
                if _closed_here % _PROGRESS_EVERY == 0:
                    _LOG.info("fanin: %d joins closed by this worker", _closed_here)
                yield obj
            else:
                yield pvalue.TaggedOutput(tag, obj)
