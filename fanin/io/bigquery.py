"""BigQuery sink for the outputs (Dataflow users): one table per output, same columns as Parquet.

Guarantees:
- ``WriteOutputTable(dataset, kind, streaming)`` writes each object as one row of
  ``<dataset>.<kind>`` (``closes``, ``late``, ``dead_letter``) with the committed schema
  (``fanin/contracts/bigquery/<kind>.json``, the same columns as the Parquet files), creating
  the table if needed and appending. Rows are converted by ``fanin.contracts.tables
  .to_bigquery_row`` (TIMESTAMP columns as RFC 3339 UTC text), so a row that breaks the schema
  fails here, loudly, not in BigQuery.
- Bounded runs load with file loads (``FILE_LOADS``: exactly once per successful job).
- Streaming runs use ``STREAMING_INSERTS`` (``tabledata.insertAll``), pure Python: Beam gives
  each row an insert id and commits the ids through a shuffle before inserting, so a retried
  bundle re-sends the same ids and BigQuery drops the repeat (best effort, a short window).
  Transient errors are retried with back-off; a row BigQuery refuses for good (e.g. over
  BigQuery's 10 MB row limit) is not retried forever: Beam logs it and counts it, and the row is
  still in the output files, which are the record. Why not the Storage Write API:
  ``docs/runners.md`` ("BigQuery").
- Nothing here touches the network until the pipeline runs, except ``check_credentials``
  (Google's credential lookup), which a run calls before it starts.
"""

from __future__ import annotations

import re
from typing import Any

import apache_beam as beam
from apache_beam.io.gcp.bigquery import BigQueryDisposition, WriteToBigQuery
from apache_beam.io.gcp.bigquery_tools import RetryStrategy
from apache_beam.pvalue import PCollection, PDone

from fanin.contracts.tables import bigquery_schema, to_bigquery_row
from fanin.io.credentials import require_google_credentials

__all__ = ["WriteOutputTable", "check_credentials", "validate_dataset", "write_method"]

_DATASET = re.compile(r"(?:[a-z][-a-z0-9.:]{4,61}[a-z0-9][:.])?[A-Za-z0-9_]{1,1024}\Z")


def validate_dataset(dataset: str) -> str:
    """``PROJECT:DATASET``, ``PROJECT.DATASET`` or ``DATASET``; raises ValueError otherwise."""
    if not _DATASET.match(dataset):
        raise ValueError(f"--bigquery-dataset {dataset!r}: expected PROJECT:DATASET or DATASET")
    return dataset


def check_credentials() -> None:
    """Raise ``ValueError`` (one line) when there are no Google credentials to reach BigQuery
    with: Beam would retry its first BigQuery call with tracebacks, then fail the job."""
    require_google_credentials("--bigquery-dataset", "BigQuery")


def write_method(streaming: bool) -> str:
    """The ``WriteToBigQuery.Method`` Fanin uses: file loads when bounded, streaming inserts
    when streaming (both pure Python; no expansion service, no Java at launch)."""
    return (WriteToBigQuery.Method.STREAMING_INSERTS if streaming
            else WriteToBigQuery.Method.FILE_LOADS)


class WriteOutputTable(beam.PTransform[PCollection[Any], PDone]):
    """Output objects of one kind -> rows of the BigQuery table ``<dataset>.<kind>``."""

    def __init__(self, dataset: str, kind: str, streaming: bool) -> None:
        super().__init__()
        self._table = f"{validate_dataset(dataset)}.{kind}"
        self._kind = kind
        self._streaming = streaming

    def expand(self, pcoll: PCollection[Any]) -> PDone:
        retry: dict[str, Any] = ({"insert_retry_strategy": RetryStrategy.RETRY_ON_TRANSIENT_ERROR}
                 if self._streaming else {})
        return (
            pcoll
            | "ToRow" >> beam.Map(lambda obj, kind=self._kind: to_bigquery_row(kind, obj))
            | "Write" >> WriteToBigQuery(
                table=self._table, schema={"fields": bigquery_schema(self._kind)},
                create_disposition=BigQueryDisposition.CREATE_IF_NEEDED,
                write_disposition=BigQueryDisposition.WRITE_APPEND,
                method=write_method(self._streaming), **retry)
        )
