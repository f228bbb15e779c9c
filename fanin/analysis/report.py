"""An operator's report over an output folder: terminal summary and one self-contained HTML file.

``build_report(dir)`` runs fixed SQL through ``fanin.analysis.query.open_outputs`` (so it sees
exactly what ``fanin query`` sees, JSONL and Parquet alike) and returns a ``Report`` of charts:

- ``close-reasons``: closes per ``closed_at`` bucket (bucket width chosen so there are at most
  ``MAX_BUCKETS``), stacked by reason;
- ``latency``: p50/p95/p99 of ``latency_ms`` per contract (continuous quantiles);
- ``missing`` / ``failed``: the ``TOP_N`` branches most often missing / failed in closes;
- ``conflicts``: conflicts by kind; ``late``: late messages by reason; ``dead-letters``: by error.

Guarantees: ``write_html`` writes one HTML file (atomically) with inline SVG charts, inline CSS
and no external URL, script or font; every chart is a ``<section id="chart-<id>">`` that holds
an ``<svg>`` when it has data and a ``<p class="nodata">No data</p>`` note when it has none.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from html import escape
from typing import Any

import duckdb

from fanin.analysis import svg
from fanin.analysis.interrupts import interrupts_held
from fanin.analysis.query import open_outputs, visible
from fanin.contracts.timefmt import MIN_MS, format_ms
from fanin.io.files import atomic_write

__all__ = ["MAX_BUCKETS", "TOP_N", "Chart", "Report", "build_report", "report_html",
           "summary_text", "write_html"]

MAX_BUCKETS = 60
TOP_N = 15
_REASONS = ("complete", "partial", "timeout")
_BUCKETS = (
    ("1 second", 1), ("10 seconds", 10), ("1 minute", 60), ("10 minutes", 600),
    ("1 hour", 3600), ("6 hours", 21600), ("1 day", 86400), ("7 days", 604800),
    ("30 days", 2592000), ("365 days", 31536000), ("3650 days", 315360000),
    ("36500 days", 3153600000), ("182500 days", 15768000000),  # year 1 to 9999: 21 buckets
)


@dataclass(frozen=True)
class Chart:
    """One chart: rows (``categories``) by named value ``series``; ``stacked`` = time columns."""

    id: str
    title: str
    categories: tuple[str, ...]
    series: tuple[tuple[str, tuple[float, ...]], ...]
    stacked: bool = False
    unit: str = ""
    note: str = ""

    @property
    def empty(self) -> bool:
        """True when there is nothing to draw."""
        return not self.categories

    def total(self, name: str) -> float:
        """Sum of series ``name`` (0 if absent)."""
        return sum(next((vals for n, vals in self.series if n == name), ()))


@dataclass(frozen=True)
class Report:
    """Everything the HTML and the summary show; built once, rendered twice."""

    directory: str
    rows: dict[str, int]
    latency: tuple[float, float, float] | None
    charts: tuple[Chart, ...]

    def chart(self, chart_id: str) -> Chart:
        """The chart with ``chart_id``; ``KeyError`` if absent."""
        for chart in self.charts:
            if chart.id == chart_id:
                return chart
        raise KeyError(chart_id)


def _counts(con: duckdb.DuckDBPyConnection, chart_id: str, title: str, sql: str) -> Chart:
    """A one-series chart from ``sql`` returning (label, count) rows in display order."""
    rows = con.execute(sql).fetchall()
    return Chart(chart_id, title, tuple(str(r[0]) for r in rows),
                 (("count", tuple(float(r[1]) for r in rows)),))


def _bucket(con: duckdb.DuckDBPyConnection) -> tuple[str, int] | None:
    """The narrowest bucket that spans the closes in at most ``MAX_BUCKETS`` columns (buckets
    count from 1970, as ``time_bucket`` aligns them)."""
    ends = con.execute(
        "SELECT epoch_ms(min(closed_at)), epoch_ms(max(closed_at)) FROM closes").fetchone()
    if ends is None or ends[0] is None:
        return None
    first, last = ends
    for name, seconds in _BUCKETS:
        if last // (seconds * 1000) - first // (seconds * 1000) + 1 <= MAX_BUCKETS:
            return name, seconds
    return _BUCKETS[-1]


def _reasons_over_time(con: duckdb.DuckDBPyConnection) -> Chart:
    title = "Close reasons over time (by closed_at, UTC)"
    bucket = _bucket(con)
    if bucket is None:
        return Chart("close-reasons", title, (), ())
    name, seconds = bucket
    rows = con.execute(
        f"SELECT epoch_ms(time_bucket(INTERVAL '{name}', closed_at, "  # noqa: S608 (constant)
        "TIMESTAMPTZ '1970-01-01')) "
        "AS b, reason, count(*) FROM closes GROUP BY ALL ORDER BY b"
    ).fetchall()
    start, end = rows[0][0], rows[-1][0]
    buckets = list(range(start, end + 1, seconds * 1000))
    index = {b: i for i, b in enumerate(buckets)}
    reasons = [*_REASONS, *sorted({r[1] for r in rows} - set(_REASONS))]
    grid = {r: [0.0] * len(buckets) for r in reasons}
    for b, reason, count in rows:
        grid[reason][index[b]] += count
    series = tuple((r, tuple(v)) for r, v in grid.items() if any(v))
    # a bucket that starts before year 1 (buckets count from 1970) is labelled from there
    labels = tuple(format_ms(max(b, MIN_MS))[:19].replace("T", " ") for b in buckets)
    return Chart("close-reasons", title, labels, series, stacked=True, note=f"bucket: {name}")


def _latency(con: duckdb.DuckDBPyConnection) -> Chart:
    rows = con.execute(
        "SELECT coalesce(contract, '(no contract)') AS c, "
        "quantile_cont(latency_ms, [0.5, 0.95, 0.99]) FROM closes GROUP BY c ORDER BY c"
    ).fetchall()
    series = tuple(
        (name, tuple(float(r[1][i]) for r in rows)) for i, name in enumerate(("p50", "p95", "p99"))
    )
    return Chart("latency", "Close latency percentiles by contract", tuple(r[0] for r in rows),
                 series if rows else (), unit=" ms")


def _top_branches(con: duckdb.DuckDBPyConnection, column: str) -> Chart:
    return _counts(
        con, column, f"Top {column} branches (required branches, per close)",
        f"SELECT b, count(*) AS n FROM closes, unnest({column}) AS t(b) "  # noqa: S608 (constant)
        f"GROUP BY b ORDER BY n DESC, b LIMIT {TOP_N}",
    )


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    """The one value of an aggregate query (which always returns one row)."""
    row = con.execute(sql).fetchone()
    if row is None:
        raise ValueError(f"no row from an aggregate query: {sql}")
    return row[0]


def build_report(directory: str | os.PathLike[str]) -> Report:
    """Query the outputs in ``directory`` (errors as ``open_outputs``) into a ``Report``.
    Ctrl-C raises ``KeyboardInterrupt`` once the statements have run (``interrupts_held``:
    never an error of DuckDB's)."""
    con = open_outputs(directory)
    try:
        with interrupts_held():
            rows = {k: _one(con, f"SELECT count(*) FROM {k}")  # noqa: S608
                    for k in ("closes", "late", "dead_letter")}
            overall = _one(con,
                           "SELECT quantile_cont(latency_ms, [0.5, 0.95, 0.99]) FROM closes")
            charts = (
                _reasons_over_time(con),
                _latency(con),
                _top_branches(con, "missing"),
                _top_branches(con, "failed"),
                _counts(con, "conflicts", "Conflicts by kind",
                        "SELECT c.kind, count(*) AS n FROM closes, unnest(conflicts) AS t(c) "
                        "GROUP BY 1 ORDER BY n DESC, 1"),
                _counts(con, "late", "Late messages by reason",
                        "SELECT reason, count(*) AS n FROM late GROUP BY 1 ORDER BY n DESC, 1"),
                _counts(con, "dead-letters", "Dead letters by error",
                        "SELECT error, count(*) AS n FROM dead_letter GROUP BY 1 ORDER BY n "
                        "DESC, 1"),
            )
    finally:
        con.close()
    latency = None if overall is None else (float(overall[0]), float(overall[1]), float(overall[2]))
    return Report(str(directory), rows, latency, charts)


def _breakdown(chart: Chart, limit: int = 5) -> str:
    if chart.stacked:
        parts = [(name, sum(vals)) for name, vals in chart.series]
    else:
        parts = list(zip(chart.categories, chart.series[0][1], strict=True)) if chart.series else []
    text = ", ".join(f"{visible(str(name))} {svg.whole(value)}" for name, value in parts[:limit]) \
        or "none"
    return text + (", ..." if len(parts) > limit else "")


def summary_text(report: Report) -> str:
    """A few plain lines for the terminal: totals, latency, top problems (names as
    ``visible`` shows them: a branch named with an escape sequence cannot drive the
    terminal)."""
    lat = report.latency
    latency = f"p50 {svg.whole(lat[0])} / p95 {svg.whole(lat[1])} / p99 {svg.whole(lat[2])} ms" \
        if lat else "n/a"
    rows = report.rows

    def part(chart_id: str) -> str:
        return _breakdown(report.chart(chart_id))

    lines = [
        f"Fanin outputs in {visible(report.directory)}",
        f"  closes:       {rows['closes']:,} ({part('close-reasons')})",
        f"  latency:      {latency}",
        f"  conflicts:    {part('conflicts')}",
        f"  top missing:  {part('missing')}",
        f"  top failed:   {part('failed')}",
        f"  late:         {rows['late']:,} ({part('late')})",
        f"  dead letters: {rows['dead_letter']:,} ({part('dead-letters')})",
    ]
    return "\n".join(lines) + "\n"


def _section(chart: Chart) -> str:
    if chart.empty:
        body = '<p class="nodata">No data</p>'
    elif chart.stacked:
        body = svg.stacked_columns(chart.categories, chart.series, chart.title)
    else:
        body = svg.grouped_bars(chart.categories, chart.series, chart.title, chart.unit)
    note = f'<p class="note">{escape(chart.note)}</p>' if chart.note and not chart.empty else ""
    return f'<section id="chart-{chart.id}"><h2>{escape(chart.title)}</h2>{note}{body}</section>'


_CSS = (
    "body{font-family:sans-serif;margin:24px;color:#222;max-width:820px}"
    "section{border-top:1px solid #ddd;padding:8px 0 16px}h2{font-size:16px;margin:8px 0}"
    ".nodata{color:#888;font-style:italic;padding:16px;border:1px dashed #bbb}"
    ".note{color:#666;font-size:12px;margin:0 0 4px}pre{background:#f6f6f6;padding:8px}"
)


def report_html(report: Report) -> str:
    """The report as one self-contained HTML page."""
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Fanin report</title><style>{_CSS}</style></head><body>"
        f"<h1>Fanin report</h1><p>Outputs: <code>{escape(report.directory)}</code>; "
        f"generated {generated}.</p><pre>{escape(summary_text(report))}</pre>"
        + "".join(_section(c) for c in report.charts)
        + "</body></html>\n"
    )


def write_html(report: Report, path: str | os.PathLike[str]) -> None:
    """Write the report as one self-contained HTML file at ``path`` (atomic replace)."""
    html = report_html(report)
    atomic_write(path, lambda fh: fh.write(html.encode("utf-8")))
