"""BigQuery sink for the outputs (Dataflow users): one table per output, same columns as Parquet.

Guarantees:
- ``WriteOutputTable(dataset, kind)`` writes each object as one row of ``<dataset>.<kind>``
  (``closes``, ``late``, ``dead_letter``) with the committed schema
  (``fanin/contracts/bigquery/<kind>.json``, the same columns as the Parquet files), creating
  the table if needed and appending. Rows are converted by ``fanin.contracts.tables
  .to_bigquery_row``, so a row that breaks the schema fails here, loudly, not in BigQuery.
- Bounded runs load with file loads; streaming runs use the Storage Write API at least once
  (``STORAGE_API_AT_LEAST_ONCE``: the reducer's outputs are per join, duplicates on retry carry
  the same ``join_id``).
- Nothing here touches the network until the pipeline runs.
"""

from __future__ import annotations

import re

import apache_beam as beam
from apache_beam.io.gcp.bigquery import BigQueryDisposition, WriteToBigQuery

from fanin.contracts.tables import bigquery_schema, to_bigquery_row

__all__ = ["WriteOutputTable", "validate_dataset"]

_DATASET = re.compile(r"(?:[a-z][-a-z0-9.:]{4,61}[a-z0-9][:.])?[A-Za-z0-9_]{1,1024}\Z")


def validate_dataset(dataset: str) -> str:
    """``PROJECT:DATASET``, ``PROJECT.DATASET`` or ``DATASET``; raises ValueError otherwise."""
    if not _DATASET.match(dataset):
        raise ValueError(f"--bigquery-dataset {dataset!r}: expected PROJECT:DATASET or DATASET")
    return dataset


class WriteOutputTable(beam.PTransform):
    """Output objects of one kind -> rows of the BigQuery table ``<dataset>.<kind>``."""

    def __init__(self, dataset: str, kind: str, streaming: bool) -> None:
        super().__init__()
        self._table = f"{validate_dataset(dataset)}.{kind}"
        self._kind = kind
        self._streaming = streaming

    def expand(self, pcoll: beam.PCollection) -> beam.pvalue.PDone:
        method = (WriteToBigQuery.Method.STORAGE_API_AT_LEAST_ONCE if self._streaming
                  else WriteToBigQuery.Method.FILE_LOADS)
        return (
            pcoll
            | "ToRow" >> beam.Map(lambda obj, kind=self._kind: to_bigquery_row(kind, obj))
            | "Write" >> WriteToBigQuery(
                table=self._table, schema={"fields": bigquery_schema(self._kind)},
                create_disposition=BigQueryDisposition.CREATE_IF_NEEDED,
                write_disposition=BigQueryDisposition.WRITE_APPEND, method=method)
        )
