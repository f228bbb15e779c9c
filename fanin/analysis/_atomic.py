"""Atomic file replacement shared by the Parquet, query and report writers.

Guarantee: ``atomic_write(path, write)`` calls ``write`` on a binary file under a hidden
temporary name (``.<name>.<random>.tmp``) in ``path``'s own folder, fsyncs it, then
``os.replace``s it onto ``path`` and fsyncs the folder. Readers see the old file, no file, or
the complete new file; never a partial one under the final name. On error the temporary file is
removed and the error re-raised.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_write"]


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], None]) -> None:
    """Create or replace ``path`` atomically with what ``write`` writes to the file handle."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
