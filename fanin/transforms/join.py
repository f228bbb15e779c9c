"""Beam composites that join records by ``join_id``: a bounded plan and a streaming plan.

``JoinRecords(catalog, streaming=...)`` takes keyed input and returns a ``DoOutputsTuple``
with ``closes``, ``late`` and ``dead_letter`` outputs.

- Bounded (``streaming=False``): raw messages packed with their sources and keyed by
  join_id (``KeyMessages``), a
  ``GroupByKey``, then each join's messages are parsed and the closing decision is taken over
  all of its records at once. This is the exact event-time result of docs/spec.md §4 and the
  fastest plan on the local runner (docs/beam-notes.md); the parity test in
  ``tests/pipeline/test_pipeline_runs.py`` proves it equals the streaming plan.
- Streaming (``streaming=True``): ``JoinDoFn``, a stateful DoFn in the global window. See its
  docstring for what it guarantees.

Metrics (namespace ``fanin``): ``closes.<reason>``, ``late.<reason>``,
``dead_letter.<error>``, distribution ``close.latency_ms``.

Poison-proof: an exception raised by the core while folding, deciding or encoding one join
does not fail the bundle, which a runner would retry forever in a stream; the counter
``dead_letter.internal_error`` grows and the run goes on. Streaming (every such call goes
through ``_core``): the records that join holds (and the one arriving) go to
``dead_letter`` with error ``internal_error`` (``detail``: the exception's type and first
line) and the join's state is cleared. Bounded (``bounded_outputs``' ``on_error``): the
outputs already emitted stand and the records not yet in an output are those dead letters.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.pvalue import PCollection

from fanin.contracts.catalog import Catalog
from fanin.contracts.parsing import DEFAULT_MAX_BYTES
from fanin.core.outcomes import CLOSES, DEAD_LETTER, LATE
from fanin.transforms.join_bounded import CloseGroups
from fanin.transforms.join_outputs import DEFAULT_MAX_BYTES_PER_JOIN
from fanin.transforms.join_streaming import JoinDoFn

__all__ = ["DEFAULT_MAX_BYTES_PER_JOIN", "JoinDoFn", "JoinRecords"]


class JoinRecords(beam.PTransform[PCollection[Any], pvalue.DoOutputsTuple]):
    """Keyed input -> ``closes`` (main), ``late``, ``dead_letter`` outputs.

    Streaming: ``(join_id, record)`` (``ParseMessages``). Bounded: ``(join_id, packed
    message)`` (``KeyMessages``), parsed after the shuffle with ``max_message_bytes``.

    ``input_end_ms`` (streaming): the last watermark of a finite stream (a replay) before
    +infinity, None when unknown (``JoinDoFn``).
    """

    def __init__(self, catalog: Catalog, streaming: bool, max_messages_per_join: int = 100_000,
                 max_bytes_per_join: int = DEFAULT_MAX_BYTES_PER_JOIN, log_closes: bool = False,
                 max_message_bytes: int = DEFAULT_MAX_BYTES, input_end_ms: int | None = None,
                 close_processes: int = 1) -> None:
        super().__init__()
        if max_messages_per_join < 1 or max_bytes_per_join < 1 or max_message_bytes < 1:
            raise ValueError("max_messages_per_join, max_bytes_per_join and max_message_bytes "
                             "must be >= 1")
        self._catalog = catalog
        self._streaming = streaming
        self._max_messages = max_messages_per_join
        self._max_bytes = max_bytes_per_join
        self._max_message_bytes = max_message_bytes
        self._log_closes = log_closes
        self._input_end_ms = input_end_ms
        self._close_processes = close_processes

    def expand(self, keyed: PCollection[Any]) -> pvalue.DoOutputsTuple:
        if self._streaming:
            return keyed | "StatefulJoin" >> beam.ParDo(
                JoinDoFn(self._catalog, self._max_messages, max_bytes=self._max_bytes,
                         log_closes=self._log_closes, input_end_ms=self._input_end_ms)
            ).with_input_types(tuple[str, tuple[Any, ...]]).with_outputs(
                LATE, DEAD_LETTER, main=CLOSES)
        return (
            keyed
            | "GroupByJoin" >> beam.GroupByKey()
            | "Close" >> beam.ParDo(CloseGroups(
                self._catalog, self._max_messages, self._max_bytes, self._log_closes,
                self._max_message_bytes, self._close_processes)
            ).with_outputs(LATE, DEAD_LETTER, main=CLOSES)
        )
