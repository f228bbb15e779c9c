"""The framing of newline-delimited JSON input: which lines of a byte stream are messages.

One rule for ``fanin run --input`` (``fanin.transforms.read``) and ``fanin publish``
(``fanin.io.publish``), so a file means the same messages read directly or through Pub/Sub
(docs/spec.md §1, "Lines"). Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["LongLine", "message_lines", "whole_characters"]

_BOM = b"\xef\xbb\xbf"


class LongLine(bytes):
    """The first bytes of a line longer than its reader's limit, never held whole
    (``fanin.io.inputs``); ``size``: the line's length in bytes (its ending not counted). A
    message it holds is ``too_large`` (docs/spec.md §1), whatever its first bytes are."""

    size: int

    def __new__(cls, first: bytes, size: int) -> LongLine:
        line = super().__new__(cls, first)
        line.size = size
        return line

    @classmethod
    def of(cls, line: bytes, max_bytes: int, size: int | None = None) -> LongLine:
        """The ``LongLine`` of a line whose first bytes (at least ``max_bytes + 6`` of them,
        or all) are ``line``: its first ``max_bytes + 6`` bytes, less the start of a UTF-8
        character the cut splits; ``size``: the line's length (default ``len(line)``). A file's
        line and a Pub/Sub message of the same bytes keep the same first bytes."""
        return cls(whole_characters(line[:max_bytes + 6]), len(line) if size is None else size)

    def __reduce__(self) -> tuple[type[LongLine], tuple[bytes, int]]:
        """Pickled (and so through Beam's coders) as itself."""
        return LongLine, (bytes(self), self.size)


def message_lines(handle: Iterable[bytes]) -> Iterator[tuple[bytes, int]]:
    """``(line, number)`` of every message of a newline-delimited byte stream: the one rule of
    ``fanin run --input`` and ``fanin publish``. Numbers count every line from 1; the line ending
    (``\\n`` or ``\\r\\n``) is removed, as is a UTF-8 byte order mark at the start of the
    stream; a line that is then empty is not a message; any other line (whitespace only
    included) is one, valid or not. A ``LongLine`` stays one (it has no ending)."""
    for number, line in enumerate(handle, start=1):
        if number == 1 and line.startswith(_BOM):
            line = LongLine(line[len(_BOM):], line.size - len(_BOM)) \
                if type(line) is LongLine else line[len(_BOM):]
        if line.endswith(b"\n"):
            line = line[:-1]
            if line.endswith(b"\r"):
                line = line[:-1]
        if line:
            yield line, number


def whole_characters(first: bytes) -> bytes:
    """``first`` without the start of a UTF-8 character its end cuts (at most 3 bytes)."""
    try:
        first.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":
            return first[:exc.start]
    return first
