"""Beam I/O for Fanin: Pub/Sub (``pubsub``), BigQuery (``bigquery``), Parquet files
(``parquet``), local and remote file helpers (``files``), and the ``publish`` subcommand
(``cli``).

Nothing is imported here, so that ``fanin.io.files`` (standard library only) can be used
without loading Apache Beam or the Pub/Sub client.
"""
