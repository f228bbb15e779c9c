"""Two hand-written inline SVG chart primitives for the HTML report.

Hand-written rather than matplotlib: no extra dependency, byte-for-byte deterministic output,
a few KB per chart, and labels stay real text (selectable, searchable, sharp at any zoom).

Guarantees: the output is a standalone ``<svg>`` element with every label HTML-escaped and no
external reference; each non-zero value yields a visible bar of at least 1 px; inputs must be
non-empty (callers render a "no data" note instead).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

__all__ = ["PALETTE", "Series", "grouped_bars", "stacked_columns", "whole"]

Series = tuple[str, Sequence[float]]
PALETTE = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2")
_WIDTH = 760
_FONT = 'font-family="sans-serif" font-size="12"'


def whole(value: float) -> str:
    """``value`` to the nearest integer, a half away from zero (Python's ``:.0f`` rounds it
    to even: 14676.5 and 3789.5 showed as 14,676 and 3,790), with thousands separators;
    NaN and infinities as ``:.0f`` writes them."""
    if not math.isfinite(value):
        return f"{value:,.0f}"
    whole_part = math.trunc(value)
    if abs(value - whole_part) == 0.5:  # exact for a double: a true half
        return f"{whole_part + (1 if value > 0 else -1):,}"
    return f"{round(value):,}"


def _number(value: float) -> str:
    return whole(value) if float(value).is_integer() or abs(value) >= 100 else f"{value:,.2f}"


def _legend(series: Sequence[Series], y: int) -> list[str]:
    parts, x = [], 10
    for i, (name, _) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{color}"/>')
        parts.append(f'<text x="{x + 16}" y="{y}" {_FONT}>{escape(name)}</text>')
        x += 28 + 7 * len(name)
    return parts


def _svg(height: int, parts: list[str], title: str) -> str:
    body = "".join(parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        f'viewBox="0 0 {_WIDTH} {height}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{body}</svg>"
    )


def grouped_bars(
    categories: Sequence[str], series: Sequence[Series], title: str, unit: str = ""
) -> str:
    """Horizontal bars: one row per category, one bar per series, value printed at its end."""
    label_w, bar_h, gap = 220, 14, 10
    top = 30 if len(series) > 1 else 6  # room for the legend
    area = _WIDTH - label_w - 90
    peak = max((v for _, vals in series for v in vals), default=0) or 1
    row_h = bar_h * len(series) + gap
    parts = _legend(series, 16) if len(series) > 1 else []
    for r, category in enumerate(categories):
        y0 = top + r * row_h
        label = escape(category if len(category) <= 32 else category[:31] + "…")
        parts.append(
            f'<text x="{label_w - 8}" y="{y0 + bar_h * len(series) / 2 + 4:.1f}" '
            f'text-anchor="end" {_FONT}>{label}</text>'
        )
        for s, (_, values) in enumerate(series):
            value = values[r]
            w = max(area * value / peak, 1.0 if value else 0.0)
            y = y0 + s * bar_h
            parts.append(
                f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h - 2}" '
                f'fill="{PALETTE[s % len(PALETTE)]}"/>'
            )
            parts.append(
                f'<text x="{label_w + w + 4:.1f}" y="{y + bar_h - 4}" {_FONT}>'
                f"{_number(value)}{escape(unit)}</text>"
            )
    return _svg(top + len(categories) * row_h + 10, parts, title)


def stacked_columns(buckets: Sequence[str], series: Sequence[Series], title: str) -> str:
    """Vertical columns per time bucket, stacked by series; first/last bucket labels shown."""
    left, top, plot_h, plot_w = 60, 30, 220, _WIDTH - 80
    totals = [sum(vals[i] for _, vals in series) for i in range(len(buckets))]
    peak = max(totals) or 1
    col_w = plot_w / len(buckets)
    parts = _legend(series, 16)
    base = top + plot_h
    parts.append(f'<line x1="{left}" y1="{base}" x2="{left + plot_w}" y2="{base}" stroke="#333"/>')
    parts.append(f'<text x="{left - 6}" y="{top + 4}" text-anchor="end" {_FONT}>'
                 f'{whole(peak)}</text>')
    parts.append(f'<text x="{left - 6}" y="{base}" text-anchor="end" {_FONT}>0</text>')
    for i in range(len(buckets)):
        y = float(base)
        for s, (_, values) in enumerate(series):
            h = max(plot_h * values[i] / peak, 1.0 if values[i] else 0.0)
            y -= h
            parts.append(
                f'<rect x="{left + i * col_w + 1:.1f}" y="{y:.1f}" width="{max(col_w - 2, 1):.1f}" '
                f'height="{h:.1f}" fill="{PALETTE[s % len(PALETTE)]}"/>'
            )
    first, last = escape(buckets[0]), escape(buckets[-1])
    parts.append(f'<text x="{left}" y="{base + 16}" {_FONT}>{first}</text>')
    if len(buckets) > 1:
        parts.append(
            f'<text x="{left + plot_w}" y="{base + 16}" text-anchor="end" {_FONT}>{last}</text>'
        )
    return _svg(base + 26, parts, title)
