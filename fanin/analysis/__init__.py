"""Analysis of the pipeline's outputs (docs/spec.md §5): fixed table schemas, SQL, and an HTML
report.

- ``fanin.contracts.tables``: Arrow/Parquet/BigQuery schemas and row conversion.
- ``fanin.analysis.query``: read-only DuckDB views ``closes``, ``late``, ``dead_letter``.
- ``fanin.analysis.report``: a self-contained HTML report and a terminal summary.
- ``fanin.analysis.cli``: the ``fanin query`` and ``fanin report`` subcommands.
"""

__all__: list[str] = []
