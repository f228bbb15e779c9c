"""One input message (bytes or text) -> a ``Record`` or a dead-letter object (docs/spec.md §1, §5).

Guarantees:
- Never raises for any input: every failure is returned as a dead-letter dict
  ``{"error", "detail", "raw", "source"}`` (plus ``raw_base64`` when the bytes are not UTF-8,
  so the exact input is never lost).
- ``error`` is one of the codes in ``ERRORS``; ``detail`` is one human line naming the field
  and the problem (all bad fields, one clause each).
- A message longer than ``max_bytes`` (default 256 KiB, UTF-8 bytes) is ``too_large``.
- ``unknown_contract`` when a message names a contract the catalog lacks.
- ``read_join_id`` is a cheap look at a message's ``join_id`` for a plan that groups raw
  messages and parses them after the shuffle: when it returns a join_id, that is the join_id
  of the record ``parse_message`` returns for the message, if it returns one.
"""

from __future__ import annotations

import base64
import functools
import math
from collections.abc import Container, Iterable
from typing import Any

import orjson
from pydantic import ValidationError

from fanin.contracts import records as R
from fanin.contracts.jsonvalue import JSON_WHITESPACE, JSONRefused, canonical, encode_str, loads
from fanin.contracts.lines import LongLine
from fanin.contracts.messages import MAX_ATTEMPT, OpenMessage, ReceiptMessage
from fanin.contracts.timefmt import duration_ms, format_ms, parse_rfc3339

__all__ = ["DEFAULT_MAX_BYTES", "ERRORS", "Source", "dead_letter", "is_utf8", "parse_message",
           "read_join_id", "source_object"]

# Where a message came from: a dict (e.g. Pub/Sub's), or ``(path, line)`` for a file line,
# kept compact because every record carries it through the shuffle.
Source = dict[str, Any] | tuple[str, int]

DEFAULT_MAX_BYTES = 256 * 1024

ERRORS = (
    "too_large",
    "not_utf8",
    "invalid_json",
    "not_object",
    "invalid_message",
    "unknown_contract",
    "undefined_join",
    "join_too_large",
    "internal_error",  # the core failed on the message's join (fanin.transforms.join)
)


def source_object(source: Source) -> dict[str, Any]:
    """The ``source`` field of a dead letter: file lines become ``{kind, file, line}``."""
    if isinstance(source, dict):
        return source
    path, line = source
    return {"kind": "file", "file": path, "line": line}


def dead_letter(error: str, detail: str, raw: str | bytes, source: Source
                ) -> dict[str, Any]:
    """Build a dead-letter object; bytes that are not UTF-8 are kept exactly in ``raw_base64``."""
    line: dict[str, Any] = {"error": error, "detail": detail}
    if isinstance(raw, bytes):
        try:
            line["raw"] = raw.decode("utf-8")
        except UnicodeDecodeError:
            line["raw"] = raw.decode("utf-8", errors="replace")
            line["raw_base64"] = base64.b64encode(raw).decode("ascii")
    else:
        line["raw"] = raw
    line["source"] = source_object(source)
    return line


def _json_refusal(text: str, exc: JSONRefused) -> str:
    """The reason of an ``invalid_json`` dead letter, naming the two cases the decoder's own
    words ("Expecting value: line 1 column 1") leave unclear."""
    if not text.strip(JSON_WHITESPACE):
        return "an empty message" if not text else "only white space"
    if text.startswith("\ufeff"):
        return f"starts with a byte order mark (U+FEFF), which is not JSON: {exc}"
    return str(exc)


def is_utf8(text: str) -> bool:
    """Whether UTF-8 can encode ``text`` (a lone surrogate cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _field_errors(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "message"
        parts.append(f"field {loc}: {err['msg']}")
    return "; ".join(parts)


def _both(required: Iterable[str] | None, optional: Iterable[str] | None) -> str:
    """The detail of an open naming branches both required and optional, else ``""``."""
    both = set(required or ()) & set(optional or ())
    return f"branches both required and optional: {sorted(both)}" if both else ""


def _names_or_none(value: Any) -> list[str] | None:
    """``value`` when it is a valid list of branch names (the open's rule), else None."""
    return value if _names(value) and value is not None else None


def _sorted_names(names: list[str] | None) -> tuple[str, ...] | None:
    return None if names is None else tuple(sorted(set(names)))


def _open_record(msg: OpenMessage, text: str, source: Source) -> R.Record:
    return _open_fields(msg.join_id, msg.opened_at, text, source, msg.contract, msg.run_id,
                        msg.message_id, msg.required, msg.optional, msg.deadline_s,
                        msg.allow_partial, msg.fail_fast)


def _open_fields(join_id: str, opened_at: int, text: str, source: Source, contract: str | None,
                 run_id: str | None, message_id: str | None, required: list[str] | None,
                 optional: list[str] | None, deadline_s: float | None,
                 allow_partial: bool | None, fail_fast: bool | None) -> R.Record:
    names, extra = _sorted_names(required), _sorted_names(optional)
    deadline_ms = None if deadline_s is None else duration_ms(deadline_s)
    # The open as canonical JSON, over the message table (docs/spec.md §1) only (not run_id /
    # message_id / unknown fields), opened_at normalised, branch lists as sorted sets, absent
    # (or null) omitted; an integral deadline_s is written as the integer canonical JSON
    # writes it, so that the text is orjson's (``canonical``'s fast path)
    if deadline_s is not None and deadline_s.is_integer():
        deadline_s = int(deadline_s)
    fields = {"kind": "open", "join_id": join_id, "opened_at": format_ms(opened_at),
              "contract": contract, "required": names, "optional": extra,
              "deadline_s": deadline_s, "allow_partial": allow_partial, "fail_fast": fail_fast}
    canon = canonical({name: value for name, value in fields.items() if value is not None})
    return (R.OPEN, join_id, opened_at, text, source, contract, run_id, message_id, names,
            extra, deadline_ms, allow_partial, fail_fast, canon)


def _names(value: Any) -> bool:
    """None or a list of non-empty strings (``OpenMessage``'s branch lists)."""
    return value is None or (type(value) is list and all(type(n) is str and n for n in value))


def _optional_bool(value: Any) -> bool:
    return value is None or type(value) is bool


def _fast_open(obj: dict[str, Any], text: str, source: Source) -> R.Record | None:
    """The record of an open whose every field is plainly valid, else None: exactly
    ``OpenMessage``'s rules, checked by hand (pydantic explains everything else)."""
    get = obj.get
    join_id, opened, contract, deadline = (get("join_id"), get("opened_at"), get("contract"),
                                           get("deadline_s"))
    required, optional = get("required"), get("optional")
    if not (type(join_id) is str and 0 < len(join_id) <= 256 and type(opened) is str
            and (contract is None or (type(contract) is str and contract))
            and _optional_str(get("run_id")) and _optional_str(get("message_id"))
            and _names(required) and _names(optional)
            and (deadline is None or (type(deadline) is float and 0 < deadline < math.inf)
                 or (type(deadline) is int and 0 < deadline < 2**53))
            and _optional_bool(get("allow_partial")) and _optional_bool(get("fail_fast"))):
        return None
    try:
        opened_at = parse_rfc3339(opened)
    except ValueError:
        return None
    return _open_fields(join_id, opened_at, text, source, contract, get("run_id"),
                        get("message_id"), required, optional,
                        None if deadline is None else float(deadline), get("allow_partial"),
                        get("fail_fast"))


def _receipt_record(msg: ReceiptMessage, text: str, source: Source) -> R.Record:
    return _receipt_fields(msg.join_id, msg.event_time, text, source, msg.contract, msg.run_id,
                           msg.message_id, msg.branch, msg.status, msg.key, msg.value,
                           msg.error, msg.attempt or 1, msg.opened_at)


def _receipt_fields(join_id: str, event_time: int, text: str, source: Source,
                    contract: str | None, run_id: str | None, message_id: str | None,
                    branch: str, status: str, key: str | None, value: Any, error: str | None,
                    attempt: int, opened_at: int | None) -> R.Record:
    key = branch if key is None else key
    value_canon = canonical(value)
    # == canonical([status, key, error]) + value_canon, built without the generic walk
    error_json = "null" if error is None else encode_str(error)
    content = f'["{status}",{encode_str(key)},{error_json}]' + value_canon
    return (R.RECEIPT, join_id, event_time, text, source, contract, run_id, message_id, branch,
            status, key, value, error, attempt, opened_at, content, value_canon)


_STATUSES = frozenset(("ok", "error", "timeout", "skipped"))


def _optional_str(value: Any) -> bool:
    return value is None or type(value) is str


_STR_OR_NONE = frozenset((str, type(None)))
# A join's receipts repeat its opened_at: their parse is remembered (parse_rfc3339 is pure)
_opened_ms = functools.lru_cache(maxsize=1024)(parse_rfc3339)


def _fast_receipt(obj: dict[str, Any], text: str, source: Source) -> R.Record | None:
    """The record of a receipt whose every field is plainly valid, else None.

    The hot path for well-formed traffic: exactly ``ReceiptMessage``'s rules, checked by hand.
    Anything else (including every invalid message) goes through pydantic, which explains.
    """
    get = obj.get
    join_id, branch, status, stamp = (get("join_id"), get("branch"), get("status"),
                                      get("event_time"))
    attempt, opened, contract = get("attempt"), get("opened_at"), get("contract")
    key, error, run_id, message_id = get("key"), get("error"), get("run_id"), get("message_id")
    if not (type(join_id) is str and 0 < len(join_id) <= 256 and type(branch) is str and branch
            and type(status) is str and status in _STATUSES and type(stamp) is str
            and type(key) in _STR_OR_NONE and type(error) in _STR_OR_NONE
            and type(run_id) in _STR_OR_NONE and type(message_id) in _STR_OR_NONE
            and (contract is None or (type(contract) is str and contract))
            and (attempt is None or (type(attempt) is int and 1 <= attempt <= MAX_ATTEMPT))
            and type(opened) in _STR_OR_NONE):
        return None
    try:
        event_time = parse_rfc3339(stamp)
        opened_at = None if opened is None else _opened_ms(opened)
    except ValueError:
        return None
    return _receipt_fields(join_id, event_time, text, source, contract, run_id, message_id,
                           branch, status, key, get("value"), error, attempt or 1, opened_at)


# One flat check per failure kind, each a dead-letter code.
def _json_type(value: Any) -> str:
    """JSON's name for the type of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "array" if isinstance(value, list) else "string"


def parse_message(data: bytes | str, source: Source, contracts: Container[str],  # noqa: C901
                  max_bytes: int = DEFAULT_MAX_BYTES
                  ) -> tuple[R.Record | None, dict[str, Any] | None]:
    """Validate one message. Returns ``(record, None)`` or ``(None, dead_letter)``."""
    if isinstance(data, bytes):
        if len(data) > max_bytes or type(data) is LongLine:  # its first bytes, its size
            line = data if type(data) is LongLine else LongLine.of(data, max_bytes)
            return None, dead_letter("too_large", f"{line.size} bytes > limit {max_bytes}",
                                     line, source)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, dead_letter("not_utf8", f"not UTF-8 at byte {exc.start}", data, source)
    else:
        try:
            size = len(data.encode("utf-8")) if len(data) * 4 > max_bytes else 0
        except UnicodeEncodeError:  # a lone surrogate: not UTF-8; keep the exact code points
            return parse_message(data.encode("utf-8", "surrogatepass"), source, contracts,
                                 max_bytes)
        if size > max_bytes:  # its first bytes, as for bytes (it is UTF-8: it was encoded)
            first = LongLine.of(data.encode("utf-8"), max_bytes).decode("utf-8")
            return None, dead_letter("too_large", f"{size} bytes > limit {max_bytes}", first,
                                     source)
        text = data
        if size == 0 and not is_utf8(text):
            return parse_message(text.encode("utf-8", "surrogatepass"), source, contracts,
                                 max_bytes)
    try:
        obj = loads(text, data if isinstance(data, bytes) else None)
    except JSONRefused as exc:
        return None, dead_letter("invalid_json", _json_refusal(text, exc), text, source)
    if not isinstance(obj, dict):
        return None, dead_letter("not_object", f"a JSON {_json_type(obj)}, not an object",
                                 text, source)
    kind = obj.get("kind")
    if kind is None:  # absent or null: a receipt (null means absent, docs/spec.md §1)
        kind = "receipt"
    try:
        if kind == "receipt":
            record = _fast_receipt(obj, text, source) or \
                _receipt_record(ReceiptMessage.model_validate(obj), text, source)
        elif kind == "open":
            record = _fast_open(obj, text, source) or \
                _open_record(OpenMessage.model_validate(obj), text, source)
            both = _both(record[R.O_REQUIRED], record[R.O_OPTIONAL])
            if both:
                return None, dead_letter("invalid_message", both, text, source)
        else:
            return None, dead_letter("invalid_message",
                                     "field kind: must be \"open\" or \"receipt\"", text, source)
    except ValidationError as exc:
        detail = _field_errors(exc)
        if kind == "open":  # the overlap is named with the other bad fields
            both = _both(*(_names_or_none(obj.get(f)) for f in ("required", "optional")))
            detail = f"{detail}; {both}" if both else detail
        return None, dead_letter("invalid_message", detail, text, source)
    except (ValueError, TypeError) as exc:  # e.g. a number that cannot be canonicalised
        return None, dead_letter("invalid_message", str(exc), text, source)
    contract = record[R.CONTRACT]
    if contract is not None and contract not in contracts:
        return None, dead_letter("unknown_contract", f"no contract named {contract!r}",
                                 text, source)
    return record, None


def read_join_id(data: bytes | str, max_bytes: int = DEFAULT_MAX_BYTES) -> str | None:
    """The ``join_id`` of a message that looks valid at a glance (at most ``max_bytes`` long,
    a JSON object with a ``join_id`` string of 1-256 characters), else None: the caller then
    parses it in full (``parse_message``) to key it or dead-letter it.

    Whatever it returns is the join_id ``parse_message`` gives the message's record: orjson
    decodes a string as the strict decoder does, and what it reads differently (a repeated
    field name: orjson keeps the last) the strict decoder refuses, so no record comes out.
    """
    if type(data) is LongLine:  # a long line's first bytes: too large, whatever they are
        return None
    if len(data) > max_bytes // 4 and len(data.encode("utf-8", "surrogatepass")
                                          if isinstance(data, str) else data) > max_bytes:
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    join_id = obj.get("join_id")
    return join_id if type(join_id) is str and 0 < len(join_id) <= 256 else None
