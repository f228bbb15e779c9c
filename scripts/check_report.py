"""Render a Fanin HTML report in headless Chromium and check the screenshot is not blank.

Usage: python scripts/check_report.py REPORT.html SCREENSHOT.png [--chromium PATH]

Exit 0 when the screenshot exists and shows the report's charts: at least ``MIN_INK`` of the
pixels differ from the background and at least ``MIN_COLOURS`` of the chart palette colours
appear. Exit 1 (with a reason) otherwise, 2 if Chromium is not available. Needs Pillow (a
dependency of apache-beam).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

from fanin.analysis.svg import PALETTE

__all__ = ["MIN_COLOURS", "MIN_INK", "check", "screenshot"]

MIN_INK = 0.005
MIN_COLOURS = 3


def screenshot(html: Path, png: Path, chromium: str = "chromium", timeout: float = 60) -> None:
    """Render ``html`` to ``png`` at 1200x2400 with a throwaway profile and no network use."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", f"--user-data-dir={profile}", f"--screenshot={png}",
             "--window-size=1200,2400", html.resolve().as_uri()],
            check=True, capture_output=True, timeout=timeout,
        )


def check(png: Path) -> str | None:
    """None if ``png`` looks like a rendered report, else the reason it does not."""
    with Image.open(png) as image:
        histogram = image.convert("RGB").getcolors(maxcolors=1 << 24) or []
    total = sum(n for n, _ in histogram)
    background = max(histogram, default=(0, None))[0]
    ink = 1 - background / total if total else 0.0
    palette = {tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in PALETTE}
    colours = palette & {rgb for _, rgb in histogram}
    if ink < MIN_INK:
        return f"blank: only {ink:.2%} of pixels differ from the background"
    if len(colours) < MIN_COLOURS:
        return f"only {len(colours)} chart colours visible (need {MIN_COLOURS})"
    return None


def main(argv: list[str] | None = None) -> int:
    """Render and check; print the verdict; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--chromium", default="chromium")
    args = parser.parse_args(argv)
    if shutil.which(args.chromium) is None:
        print(f"{args.chromium} not found on PATH", file=sys.stderr)
        return 2
    screenshot(args.html, args.png, args.chromium)
    problem = check(args.png)
    print(problem or f"ok: {args.png} shows the report")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
