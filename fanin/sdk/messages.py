"""Building and encoding the input messages of SPEC §1 (shared by the SDK and the simulator).

Guarantees:
- ``open_message`` and ``receipt_message`` return dicts whose fields, names and JSON types are
  exactly SPEC §1's table; optional fields that are ``None`` are left out (``value`` of an
  ``ok`` receipt is always present, ``null`` included).
- ``encode_message`` returns one compact, newline-free JSON line (UTF-8 text, non-ASCII kept).
  A value that is not JSON (an arbitrary object, ``NaN``/``Infinity``, a string with a lone
  surrogate, a non-string dict key other than int/float/bool/None) raises ``TypeError`` naming
  the join, the branch and the problem; nothing is emitted then.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fanin.sdk.context import JoinContext

__all__ = ["STATUSES", "Status", "encode_message", "open_message", "receipt_message"]

Status = Literal["ok", "error", "timeout", "skipped"]
STATUSES: tuple[Status, ...] = ("ok", "error", "timeout", "skipped")

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                            check_circular=True)


def _context_fields(msg: dict[str, Any], ctx: JoinContext, message_id: str) -> None:
    if ctx.contract is not None:
        msg["contract"] = ctx.contract
    if ctx.run_id is not None:
        msg["run_id"] = ctx.run_id
    msg["message_id"] = message_id


def open_message(ctx: JoinContext, message_id: str, *, required: list[str] | None = None,
                 optional: list[str] | None = None, deadline_s: float | None = None,
                 allow_partial: bool | None = None,
                 fail_fast: bool | None = None) -> dict[str, Any]:
    """An open for ``ctx``; the keyword fields override the contract when not ``None``."""
    msg: dict[str, Any] = {"kind": "open", "join_id": ctx.join_id, "opened_at": ctx.opened_at}
    _context_fields(msg, ctx, message_id)
    for name, names in (("required", required), ("optional", optional)):
        if names is not None:
            if isinstance(names, str) or not all(isinstance(n, str) and n for n in names):
                raise ValueError(f"{name} must be a list of non-empty branch names")
            msg[name] = list(names)
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
    except (TypeError, ValueError) as exc:
        where = f"join {msg.get('join_id')!r}"
        if "branch" in msg:
            where += f", branch {msg['branch']!r}"
        raise TypeError(f"message of {where} is not JSON-serialisable: {exc}") from exc
    return line
