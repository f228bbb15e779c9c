"""A Beam ``FileSystem`` for the scheme ``fanintest://``: a stand-in for a remote store such
as ``gs://``, kept in a local folder (``RemoteTestFileSystem.root``). Paths keep their scheme
everywhere (joins, listings), so code that builds paths with ``pathlib`` or ``os.path`` instead of
``FileSystems`` ends up writing local files named ``fanintest:/...`` and is caught.

Importing this module registers the scheme (Beam finds ``FileSystem`` subclasses by scheme in
the running process, which is where the local runners run the pipeline)."""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

from apache_beam.io.filesystem import FileMetadata, FileSystem
from apache_beam.io.localfilesystem import LocalFileSystem

SCHEME = "fanintest"
PREFIX = f"{SCHEME}://"


class RemoteTestFileSystem(FileSystem):
    """``fanintest://a/b`` is the file ``<root>/a/b``, handled by Beam's local filesystem."""

    root: Path | None = None  # set by the test before use
    _local = LocalFileSystem(None)

    @classmethod
    def scheme(cls) -> str:
        return SCHEME

    @classmethod
    def local(cls, path: str) -> str:
        if not path.startswith(PREFIX) or cls.root is None:
            raise ValueError(f"not a {SCHEME} path or no root set: {path}")
        return str(cls.root / path[len(PREFIX):])

    @classmethod
    def remote(cls, local: str) -> str:
        assert cls.root is not None
        return PREFIX + Path(local).relative_to(cls.root).as_posix()

    def _meta(self, meta: FileMetadata) -> FileMetadata:
        return FileMetadata(self.remote(meta.path), meta.size_in_bytes,
                            meta.last_updated_in_seconds)

    def join(self, basepath: str, *paths: str) -> str:
        return posixpath.join(basepath, *paths)

    def split(self, path: str) -> tuple[str, str]:
        return posixpath.split(path)

    def _url_dirname(self, url_or_path: str) -> str:
        return posixpath.dirname(url_or_path)

    def has_dirs(self) -> bool:
        return True

    def mkdirs(self, path: str) -> None:
        self._local.mkdirs(self.local(path))

    def _list(self, dir_or_prefix: str) -> Any:
        return (self._meta(m) for m in self._local._list(self.local(dir_or_prefix)))

    def create(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return self._local.create(self.local(path), *args, **kwargs)

    def open(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return self._local.open(self.local(path), *args, **kwargs)

    def copy(self, sources: list[str], destinations: list[str]) -> None:
        self._local.copy([self.local(p) for p in sources], [self.local(p) for p in destinations])

    def rename(self, sources: list[str], destinations: list[str]) -> None:
        self._local.rename([self.local(p) for p in sources],
                           [self.local(p) for p in destinations])

    def exists(self, path: str) -> bool:
        return self._local.exists(self.local(path))

    def size(self, path: str) -> int:
        return self._local.size(self.local(path))

    def last_updated(self, path: str) -> float:
        return self._local.last_updated(self.local(path))

    def checksum(self, path: str) -> str:
        return self._local.checksum(self.local(path))

    def metadata(self, path: str) -> FileMetadata:
        return self._meta(self._local.metadata(self.local(path)))

    def delete(self, paths: list[str]) -> None:
        self._local.delete([self.local(p) for p in paths])
