"""Building and encoding the input messages of docs/spec.md §1 (shared by the SDK and the
simulator).

Guarantees:
- ``open_message`` and ``receipt_message`` return dicts whose fields, names and JSON types are
  exactly docs/spec.md §1's table; optional fields that are ``None`` are left out (``value`` of an
  ``ok`` receipt is always present, ``null`` included).
- ``required``/``optional`` accept any iterable of names (a generator included): it is read
  once, and the list emitted is exactly what was validated.
- ``encode_message`` returns one compact, newline-free JSON line (UTF-8 text, non-ASCII kept).
  A value that is not JSON (an arbitrary object, ``NaN``/``Infinity``, a string with a lone
  surrogate, a non-string dict key other than int/float/bool/None, or a value whose own
  ``items()``/``__iter__`` raises any exception while it is read) raises ``TypeError`` naming
  the join, the branch and the problem; a value nested too deeply to encode raises
  ``MessageRefused`` (the parser refuses nesting deeper than ``MAX_DEPTH`` anyway); nothing is
  emitted then.
- ``refuse_unparsable(msg, line, max_bytes)`` runs the pipeline's own parser (``parse_message``, the
  function ``fanin run`` applies to every input message) on an encoded line and raises
  ``MessageRefused`` with the dead-letter code and reason when ``fanin run`` would refuse it:
  size over ``max_bytes``, nesting deeper than ``MAX_DEPTH``, fields that collide once encoded
  (``{1: ..., "1": ...}``), a branch both required and optional, an ``attempt`` past
  2**63-1... The rules live in the parser only; contract names are
  checked only against the names given (the emitter does not read the contracts file).
- ``refuse_unreportable(msg, max_bytes)`` is the same check for a receipt built before its
  branch runs (``fanin.sdk.emitter``): a code point UTF-8 cannot encode (a lone surrogate in a
  name or in the context) is not a ``TypeError`` there but is handed to the parser as it is,
  which refuses it (``not_utf8``); the ``MessageRefused`` then names the field.
- ``fit_error(text, budget)`` makes any error text sendable (see its docstring for the rule).
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable
from typing import Any, Literal

from fanin.contracts.jsonvalue import MAX_DEPTH, encode_str
from fanin.contracts.parsing import is_utf8, parse_message
from fanin.sdk.context import JoinContext

__all__ = ["ERROR_TEXT_LIMIT", "STATUSES", "MessageRefused", "Status", "encode_message",
           "fit_error", "open_message", "receipt_message", "refuse_unparsable",
           "refuse_unreportable"]

Status = Literal["ok", "error", "timeout", "skipped"]
STATUSES: tuple[Status, ...] = ("ok", "error", "timeout", "skipped")

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                            check_circular=True)


class MessageRefused(ValueError):
    """``fanin run`` would dead-letter this message; ``error`` is its dead-letter code
    (``too_large``, ``invalid_json``, ``invalid_message``...) and ``detail`` the parser's reason."""

    def __init__(self, where: str, error: str, detail: str) -> None:
        self.error = error
        self.detail = detail
        super().__init__(f"message of {where} would be dead-lettered by `fanin run` "
                         f"({error}): {detail}")


def _where(msg: dict[str, Any]) -> str:
    where = f"join {msg.get('join_id')!r}"
    if "branch" in msg:
        where += f", branch {msg['branch']!r}"
    return where


def _names(name: str, names: Iterable[str]) -> list[str]:
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise ValueError(f"{name} must be a list of non-empty branch names")
    found = list(names)  # read once: a generator is validated and emitted alike
    if not all(isinstance(n, str) and n for n in found):
        raise ValueError(f"{name} must be a list of non-empty branch names")
    return found


def _context_fields(msg: dict[str, Any], ctx: JoinContext, message_id: str) -> None:
    if ctx.contract is not None:
        msg["contract"] = ctx.contract
    if ctx.run_id is not None:
        msg["run_id"] = ctx.run_id
    msg["message_id"] = message_id


def open_message(ctx: JoinContext, message_id: str, *, required: Iterable[str] | None = None,
                 optional: Iterable[str] | None = None, deadline_s: float | None = None,
                 allow_partial: bool | None = None,
                 fail_fast: bool | None = None) -> dict[str, Any]:
    """An open for ``ctx``; the keyword fields override the contract when not ``None``."""
    msg: dict[str, Any] = {"kind": "open", "join_id": ctx.join_id, "opened_at": ctx.opened_at}
    _context_fields(msg, ctx, message_id)
    for name, names in (("required", required), ("optional", optional)):
        if names is not None:
            msg[name] = _names(name, names)
    if deadline_s is not None:
        if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) \
                or not 0 < deadline_s < float("inf"):
            raise ValueError("deadline_s must be a finite number > 0")
        msg["deadline_s"] = deadline_s
    for name, flag in (("allow_partial", allow_partial), ("fail_fast", fail_fast)):
        if flag is not None:
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be a bool")
            msg[name] = flag
    return msg


def receipt_message(ctx: JoinContext, branch: str, status: Status, event_time: str,
                    message_id: str, *, attempt: int = 1, key: str | None = None,
                    value: Any = None, error: str | None = None) -> dict[str, Any]:
    """A receipt of ``branch`` for ``ctx`` (``value`` is kept only for ``ok``)."""
    if not isinstance(branch, str) or not branch:
        raise ValueError("branch must be a non-empty string")
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError("attempt must be an integer >= 1")
    if key is not None and not isinstance(key, str):
        raise ValueError("key must be a string or None")
    if error is not None and not isinstance(error, str):
        raise ValueError("error must be a string or None")
    msg: dict[str, Any] = {"kind": "receipt", "join_id": ctx.join_id, "branch": branch,
                           "status": status, "event_time": event_time, "attempt": attempt,
                           "opened_at": ctx.opened_at}
    _context_fields(msg, ctx, message_id)
    if key is not None:
        msg["key"] = key
    if status == "ok":
        msg["value"] = value
    if error is not None:
        msg["error"] = error
    return msg


def encode_message(msg: dict[str, Any]) -> str:
    """One JSON line for ``msg``; ``TypeError`` when any part of it is not JSON."""
    try:
        line = _ENCODER.encode(msg)
        line.encode("utf-8")
    except RecursionError:
        raise MessageRefused(_where(msg), "invalid_json",
                             f"nesting deeper than {MAX_DEPTH}") from None
    except Exception as exc:  # not JSON; or a value's own method raised while it was read
        why = str(exc) if isinstance(exc, (TypeError, ValueError)) else \
            f"reading it raised {type(exc).__name__}: {exc}"
        raise TypeError(f"message of {_where(msg)} is not JSON-serialisable: {why}") from exc
    return line


class _AnyContract:
    """Every contract name: the emitter does not know the pipeline's catalog."""

    def __contains__(self, name: object) -> bool:
        return True


_ANY_CONTRACT = _AnyContract()
_SOURCE = {"kind": "sdk"}


def refuse_unparsable(msg: dict[str, Any], line: str, max_bytes: int,
                      contracts: Container[str] | None = None) -> None:
    """Raise ``MessageRefused`` if ``fanin run`` (``--max-bytes max_bytes``, a contracts file
    naming ``contracts``; ``None``: any name) would dead-letter ``line``, the encoding of
    ``msg``; the decision is ``parse_message``'s, nothing else."""
    _, dead = parse_message(line, _SOURCE, _ANY_CONTRACT if contracts is None else contracts,
                            max_bytes)
    if dead is not None:
        raise MessageRefused(_where(msg), dead["error"], dead["detail"])


def refuse_unreportable(msg: dict[str, Any], max_bytes: int,
                        contracts: Container[str] | None = None) -> None:
    """Raise ``MessageRefused`` if ``fanin run`` would dead-letter ``msg``, a message whose
    fields are all strings and integers (a receipt built before its branch runs).

    Like ``refuse_unparsable`` on its encoding, except that a string UTF-8 cannot encode (a
    lone surrogate) is not a ``TypeError``: the line is handed to the parser with the code
    points as they are, and the parser refuses it (``not_utf8``); the detail then names the
    field(s) holding one."""
    try:
        line = encode_message(msg)
    except TypeError:
        line = _ENCODER.encode(msg)  # keeps lone surrogates: the parser decides
    try:
        refuse_unparsable(msg, line, max_bytes, contracts)
    except MessageRefused as refused:
        bad = [name for name, text in msg.items()
               if isinstance(text, str) and not is_utf8(text)]
        if refused.error != "not_utf8" or not bad:
            raise
        raise MessageRefused(_where(msg), refused.error,
                             f"{refused.detail} (a lone surrogate in field(s) "
                             f"{', '.join(bad)})") from None


ERROR_TEXT_LIMIT = 16 * 1024
"""Most UTF-8 bytes an ``error`` text takes in a message (JSON-escaped), whatever it says."""


def _json_size(text: str) -> int:
    return len(encode_str(text).encode("utf-8")) - 2


def fit_error(text: str, budget: int = ERROR_TEXT_LIMIT) -> str:
    """``text`` made sendable as an ``error`` field of at most ``budget`` bytes (JSON-escaped).

    The rule: code points UTF-8 cannot encode (lone surrogates) become ``\\udXXX`` escapes
    (Python's ``backslashreplace``); then, if the text takes more than
    ``min(budget, ERROR_TEXT_LIMIT)`` bytes, it is cut at a code point and ends with
    `` [truncated: N characters]`` (N: the length before the cut). Text that fits is unchanged.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    budget = min(budget, ERROR_TEXT_LIMIT)
    if _json_size(text) <= budget:
        return text
    marker = f" [truncated: {len(text)} characters]"
    room = budget - _json_size(marker)
    if room < 0:
        return ""
    low, high = 0, min(len(text), room)  # the longest prefix that fits, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        if _json_size(text[:mid]) <= room:
            low = mid
        else:
            high = mid - 1
    return text[:low] + marker
