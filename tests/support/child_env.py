"""The environment of a child Python process that must run the same ``fanin`` as the test (so
a test run against another checkout, ``PYTHONPATH=<checkout>``, tests that code in children
too)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import fanin

__all__ = ["file_size_limited", "same_code_env"]

# Sets the limit, then becomes the command (os.execv): no fork of the test process runs it
_LIMITED = ("import os, resource, sys; n = int(sys.argv[1]); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
            "os.execv(sys.argv[2], sys.argv[2:])")


def same_code_env(**extra: str) -> dict[str, str]:
    """``os.environ`` with ``PYTHONPATH`` set to the folder holding the imported ``fanin``."""
    return {**os.environ, "PYTHONPATH": str(Path(fanin.__file__).resolve().parents[1]), **extra}


def file_size_limited(command: list[str], limit: int) -> list[str]:
    """``command`` (its first item a path) run with files limited to ``limit`` bytes: writes
    beyond it fail with EFBIG (Python ignores SIGXFSZ). A fresh interpreter sets the limit and
    becomes the command, where a ``preexec_fn`` ran in a fork of the test process, whose gRPC
    threads (loaded by earlier tests) made the child abort now and then (SIGABRT after
    ``epoll_wait error: Bad file descriptor``, seen in CI)."""
    return [sys.executable, "-c", _LIMITED, str(limit), *command]
