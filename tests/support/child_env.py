"""The environment of a child Python process that must run the same ``fanin`` as the test (so
a test run against another checkout, ``PYTHONPATH=<checkout>``, tests that code in children
too)."""

from __future__ import annotations

import os
from pathlib import Path

import fanin

__all__ = ["same_code_env"]


def same_code_env(**extra: str) -> dict[str, str]:
    """``os.environ`` with ``PYTHONPATH`` set to the folder holding the imported ``fanin``."""
    return {**os.environ, "PYTHONPATH": str(Path(fanin.__file__).resolve().parents[1]), **extra}
