"""Parquet output files: one schema per output kind (``fanin.contracts.tables``).

Guarantees: each file appears atomically (written under a temporary name, then renamed);
rows keep their input order; a malformed object raises ``ValueError`` before anything is
written. Paths are built with Beam's ``FileSystems.join``, so a remote folder (``gs://...``)
stays remote (``pathlib`` would make ``gs://b`` the local path ``gs:/b``).
"""

from __future__ import annotations

import functools
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from fanin.contracts.tables import schema, to_row
from fanin.contracts.timefmt import format_ms
from fanin.io.files import atomic_write

__all__ = ["write_parquet"]


def write_parquet(
    kind: str, objs: Iterable[Mapping[str, Any]], out_dir: str | os.PathLike[str], basename: str
) -> list[str]:
    """Write ``objs`` as Parquet into the kind's folder ``out_dir`` (``DIR/<kind>``).

    ``closes`` go to ``out_dir/close_date=YYYY-MM-DD/<basename>.parquet`` (one file per UTC date
    of ``closed_at``, rows in input order), the others to ``out_dir/<basename>.parquet``. Returns
    the sorted paths written; no objects -> no file. Each file appears atomically. Any Beam
    filesystem. Raises ``ValueError`` (before writing anything) if an object is malformed.
    """
    if not basename or "/" in basename or basename.startswith((".", "_")):
        raise ValueError(f"basename must be a plain, visible file name: {basename!r}")
    folder, name = os.fspath(out_dir), f"{basename}.parquet"
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for obj in objs:
        row = to_row(kind, obj)
        if kind == "closes":
            path = FileSystems.join(folder, f"close_date={format_ms(row['closed_at'])[:10]}", name)
        else:
            path = FileSystems.join(folder, name)
        groups[path].append(row)
    for path, group in groups.items():
        # encoded in memory, then one write: a remote filesystem's upload stream need only
        # support write()
        buffer = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(group, schema=schema(kind)), buffer,
                       compression="zstd")
        data = buffer.getvalue()
        atomic_write(path, functools.partial(_write_to, data))
    return sorted(groups)


def _write_to(data: pa.Buffer, fh: BinaryIO) -> None:
    fh.write(data)
