"""Text shown on a terminal: what a message, a contracts file or a file name may hold that
would drive the terminal (escape sequences, a newline that splits a line, a right-to-left
override) written as Python writes it in a string literal, ``\\x1b``, ``\\n``, ``\\u202e``."""

from __future__ import annotations

__all__ = ["visible"]

# C0 and C1 control characters and DEL; the line and paragraph separators; the marks and
# controls of bidirectional text (which reorder what follows them on the line): as Python
# writes them in a string literal
_ESCAPES = {code: repr(chr(code))[1:-1] for code in (
    *range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, 0x061C, 0x200E, 0x200F,
    *range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def visible(text: str) -> str:
    """``text`` for a terminal: control characters (escape sequences that retitle, clear or
    recolour it; a newline that splits a row), line separators and the controls of
    bidirectional text (a right-to-left override that reverses the rest of a row) shown as
    ``\\x1b``, ``\\n``, ``\\u2028``, ``\\u202e``..."""
    return text.translate(_ESCAPES)
