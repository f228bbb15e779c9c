"""Beam composite: raw messages -> keyed records, with a dead-letter output.

Guarantees:
- Every input element ``(data, source)`` leaves as exactly one element: either
  ``(join_id, record)`` on the main output or one dead-letter dict on ``DEAD_LETTER``.
  Nothing is logged per element; dead letters are counted by error in Beam metrics
  (namespace ``fanin``, ``dead_letter.<error>``) and valid messages in ``messages.parsed``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from fanin.contracts import records as R
from fanin.contracts.parsing import DEFAULT_MAX_BYTES, parse_message
from fanin.core.outcomes import DEAD_LETTER

__all__ = ["DEAD_LETTER", "ParseMessages"]

_LOG = logging.getLogger(__name__)
_PROGRESS_EVERY = 100_000


class _ParseFn(beam.DoFn):
    def __init__(self, contract_names: frozenset[str], max_bytes: int) -> None:
        self._contracts = contract_names
        self._max_bytes = max_bytes
        self._parsed = Metrics.counter("fanin", "messages.parsed")
        self._seen = 0
        self._bundle_parsed = 0

    def process(self, element: tuple[bytes | str, dict[str, Any]]) -> Iterator[Any]:
        data, source = element
        self._seen += 1
        if self._seen % _PROGRESS_EVERY == 0:
            _LOG.info("fanin: %d messages read by this worker", self._seen)
        record, dead = parse_message(data, source, self._contracts, self._max_bytes)
        if record is not None:
            self._bundle_parsed += 1
            yield record[R.JOIN_ID], record
        else:
            if dead is None:
                raise ValueError("parse_message returns a record or a dead letter")
            Metrics.counter("fanin", f"dead_letter.{dead['error']}").inc()
            yield pvalue.TaggedOutput(DEAD_LETTER, dead)

    def start_bundle(self) -> None:
        self._bundle_parsed = 0

    def finish_bundle(self) -> None:
        self._parsed.inc(self._bundle_parsed)  # one metric update per bundle


class ParseMessages(beam.PTransform):
    """``(data, source)`` -> main ``(join_id, record)`` + tagged ``dead_letter`` dicts."""

    def __init__(self, contract_names: frozenset[str], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__()
        if max_bytes <= 0:
            raise ValueError("max_bytes must be > 0")
        self._contracts = frozenset(contract_names)
        self._max_bytes = max_bytes

    def expand(self, pcoll: beam.PCollection) -> pvalue.DoOutputsTuple:
        return pcoll | "Validate" >> beam.ParDo(
            _ParseFn(self._contracts, self._max_bytes)
        ).with_output_types(tuple[str, tuple]).with_outputs(DEAD_LETTER, main="records")
