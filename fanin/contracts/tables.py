"""Fixed Arrow, Parquet and BigQuery schemas for the three outputs of docs/spec.md §5.

Kinds: ``closes``, ``late``, ``dead_letter`` (``KINDS``). Each has one Arrow schema
(``schema(kind)``) that is the single source of truth for the Parquet files, the BigQuery tables
(``bigquery_schema``) and the DuckDB views of ``fanin.analysis.query``.

Schema decision (why these shapes):

- Times (``opened_at``, ``deadline``, ``closed_at``, ``branches[].event_time``) are
  ``timestamp[ms, UTC]``: docs/spec.md §1 truncates every time to whole milliseconds, so nothing is
  lost, and range filters, ``date_trunc`` and partition pruning work natively in DuckDB, Spark and
  BigQuery. The RFC 3339 text is recoverable exactly with ``fanin.contracts.timefmt.format_ms``.
- Fields whose *shape is fixed by docs/spec.md* are typed columns, so they are queryable without
  JSON functions: branch-name lists are ``list<string>``, ``counts`` is a struct, ``branches`` is a
  list of structs (one per branch, sorted by branch name, the name in field ``branch``) and
  ``conflicts`` a list of structs with the documented fields. A list of structs, not a map,
  because BigQuery has no MAP type and ``REPEATED RECORD`` is its native equivalent: one column
  layout serves every engine.
- Fields whose *shape is free* are JSON text (``string`` holding compact JSON with sorted keys):
  ``values`` (key -> any JSON), ``branches[].value`` and ``conflicts[].value`` (any JSON), the late
  ``message`` (the original message, including fields the pipeline ignores) and the dead-letter
  ``source`` (differs by source kind). A struct would need a type per key that no contract
  fixes, and would silently drop or coerce values. JSON text is lossless, identical in Parquet
  and BigQuery (``STRING``, queried with ``JSON_VALUE``) and the DuckDB views cast it to ``JSON``
  (``values->>'$.score'``). Such fields carry Arrow field metadata ``fanin.encoding = json``.
- In a nullable JSON-text column SQL NULL stands for JSON ``null`` or an absent field (docs/spec.md
  §1: an absent value means null); non-nullable ones (``values``, ``message``, ``source``) always
  hold
  JSON text.
- ``conflicts[].extra`` is JSON text of any conflict fields beyond the documented ones (or null),
  so a conflict never loses a field.

Guarantees:
- Column order and types are constants of this module: the same on every run and machine.
- ``to_row`` is strict and lossless: a missing or unexpected key, a wrong JSON type, an
  integer beyond 64 bits or a malformed time raises ``ValueError`` naming the field; every
  input field lands in a column.
  Only the dead letter's ``detail`` and ``raw_base64`` may be absent (then NULL).
  Rows hold plain Python values with timestamps as epoch milliseconds (``int``).
- Parquet files are written by ``fanin.io.parquet.write_parquet`` with these schemas; closes
  are hive-partitioned by the UTC date of ``closed_at``
  (``DIR/closes/close_date=YYYY-MM-DD/<basename>.parquet``); the date is in the path only.
- ``to_bigquery_row`` is ``to_row`` with timestamps rendered as RFC 3339 UTC text; it is
  JSON-serialisable and matches ``bigquery_schema`` (for ``WriteToBigQuery``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from fanin.contracts.jsonvalue import output_json
from fanin.contracts.timefmt import format_ms, parse_rfc3339

__all__ = [
    "KINDS",
    "bigquery_schema",
    "bigquery_schema_text",
    "schema",
    "to_bigquery_row",
    "to_row",
    "to_table",
]

KINDS = ("closes", "late", "dead_letter")

_JSON = {b"fanin.encoding": b"json"}
_TS = pa.timestamp("ms", tz="UTC")
_NAMES = pa.list_(pa.field("item", pa.string(), nullable=False))


def _f(
    name: str, typ: pa.DataType, doc: str, *, null: bool = False, json_text: bool = False
) -> pa.Field:
    """A field with a description (and the JSON-text marker) in its metadata."""
    meta = {b"description": doc.encode()} | (_JSON if json_text else {})
    return pa.field(name, typ, nullable=null, metadata=meta)


_BRANCH = pa.struct(
    [
        _f("branch", pa.string(), "Branch id (path, '/' separates levels)."),
        _f("status", pa.string(), "ok, error, timeout or skipped."),
        _f("key", pa.string(), "State key the receipt writes.", null=True),
        _f("attempt", pa.int64(), "Attempt number of the current receipt.", null=True),
        _f("event_time", _TS, "Event time of the current receipt.", null=True),
        _f("value", pa.string(), "Receipt value as JSON text.", null=True, json_text=True),
        _f("error", pa.string(), "Receipt error text.", null=True),
    ]
)
_CONFLICT_FIELDS = ("kind", "branch", "key", "attempt", "detail", "value", "count", "contracts")
_CONFLICT = pa.struct(
    [
        _f("kind", pa.string(), "Conflict kind (docs/spec.md §2-§3)."),
        _f("branch", pa.string(), "Branch involved, if any.", null=True),
        _f("key", pa.string(), "State key involved, if any.", null=True),
        _f("attempt", pa.int64(), "Attempt involved, if any.", null=True),
        _f("detail", pa.string(), "One-line explanation.", null=True),
        _f("value", pa.string(), "Value involved as JSON text.", null=True, json_text=True),
        _f("count", pa.int64(), "open_conflict: number of distinct opens.", null=True),
        _f("contracts", pa.list_(pa.string()), "Contract names involved.", null=True),
        _f("extra", pa.string(), "Other fields as a JSON object text.", null=True, json_text=True),
    ]
)
_COUNTS = pa.struct(
    [
        _f("messages", pa.int64(), "Input messages folded into this close."),
        _f("duplicates", pa.int64(), "Duplicate messages."),
        _f("superseded", pa.int64(), "Receipts superseded by a higher attempt."),
    ]
)

_SCHEMAS: dict[str, pa.Schema] = {
    "closes": pa.schema(
        [
            _f("join_id", pa.string(), "Join id."),
            _f("contract", pa.string(), "Contract that defined the join.", null=True),
            _f("run_id", pa.string(), "run_id carried from the messages.", null=True),
            _f("reason", pa.string(), "complete, partial or timeout."),
            _f("opened_at", _TS, "When the fan-out opened the join (UTC)."),
            _f("deadline", _TS, "opened_at + deadline_s (UTC)."),
            _f("closed_at", _TS, "Event time at which the join closed (UTC)."),
            _f("latency_ms", pa.int64(), "closed_at - opened_at in milliseconds."),
            _f("required", _NAMES, "Required branches, sorted."),
            _f("optional", _NAMES, "Optional branches, sorted."),
            _f("pruned", _NAMES, "Declared branches removed by skips, sorted."),
            _f("missing", _NAMES,
               "Required, unpruned branches without a current receipt, sorted."),
            _f("failed", _NAMES,
               "Required, unpruned branches whose receipt is error/timeout, sorted."),
            _f("values", pa.string(), "Key -> value object as JSON text.", json_text=True),
            _f("branches", pa.list_(pa.field("item", _BRANCH, nullable=False)),
               "Current receipt per branch, sorted by branch."),
            _f("conflicts", pa.list_(pa.field("item", _CONFLICT, nullable=False)),
               "Conflicts found by the reducer."),
            _f("counts", _COUNTS, "Message counters."),
        ]
    ),
    "late": pa.schema(
        [
            _f("join_id", pa.string(), "Join id of the late message."),
            _f("reason", pa.string(), "after_close or after_deadline."),
            _f("close_reason", pa.string(), "Reason of the close it missed."),
            _f("message", pa.string(), "Original message object as JSON text.", json_text=True),
        ]
    ),
    "dead_letter": pa.schema(
        [
            _f("error", pa.string(), "Error code (too_large, invalid_json, ...)."),
            _f("detail", pa.string(), "One-line explanation.", null=True),
            _f("raw", pa.string(), "Original message text."),
            _f("source", pa.string(), "Where the message came from, JSON text.", json_text=True),
            _f("raw_base64", pa.string(), "Exact original bytes, base64, if given.", null=True),
        ]
    ),
}


def schema(kind: str) -> pa.Schema:
    """The fixed Arrow schema of ``kind``; raises ``ValueError`` for an unknown kind."""
    try:
        return _SCHEMAS[kind]
    except KeyError:
        raise ValueError(f"unknown output kind {kind!r}; expected one of {KINDS}") from None


def _json_text(value: Any) -> str:
    """Compact JSON with sorted keys, its numbers spelled as in the JSONL outputs; a value
    that is not JSON (NaN or an infinity, a string holding a lone surrogate: never in Fanin's
    outputs, maybe in a file ``fanin query`` is given) is a ``ValueError``."""
    try:
        text = output_json(value, sort_keys=True)
    except TypeError as exc:  # a lone surrogate
        raise ValueError(f"not JSON: {exc}") from None
    if "null" in text and not _finite(value):  # orjson writes NaN and infinities as null
        raise ValueError("Out of range float values are not JSON compliant")
    return text


def _finite(value: Any) -> bool:
    """No double in ``value`` is NaN or infinite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(map(_finite, value.values()))
    return all(map(_finite, value)) if isinstance(value, list) else True


_INT64 = 2**63


def _int64(value: Any, path: str) -> int:
    """``value`` if it is an integer that fits a signed 64-bit column (every integer column)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{path}: expected an integer")
    if not -_INT64 <= value < _INT64:
        raise ValueError(f"{path}: integer out of the 64-bit range")
    return value


def _convert(field: pa.Field, value: Any, path: str) -> Any:  # noqa: C901 (one branch per Arrow type of the output schema)
    """Check ``value`` against ``field`` and map it to the row representation."""
    typ = field.type
    if (field.metadata or {}).get(b"fanin.encoding") == b"json" and (
        value is not None or not field.nullable
    ):
        return _json_text(value)
    if value is None:
        if not field.nullable:
            raise ValueError(f"{path}: must not be null")
        return None
    if pa.types.is_timestamp(typ):
        if not isinstance(value, str):
            raise ValueError(f"{path}: expected an RFC 3339 string")
        try:
            return parse_rfc3339(value)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    if pa.types.is_string(typ):
        if not isinstance(value, str):
            raise ValueError(f"{path}: expected a string")
        return value
    if pa.types.is_integer(typ):
        return _int64(value, path)
    if pa.types.is_list(typ):
        if not isinstance(value, list):
            raise ValueError(f"{path}: expected a list")
        return [_convert(typ.value_field, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if pa.types.is_struct(typ):
        if not isinstance(value, Mapping):
            raise ValueError(f"{path}: expected an object")
        unexpected = sorted(value.keys() - set(typ.names))
        if unexpected:
            raise ValueError(f"{path}: unexpected fields {unexpected}")
        return {f.name: _convert(f, value.get(f.name), f"{path}.{f.name}") for f in typ}
    raise AssertionError(f"unsupported type {typ}")  # pragma: no cover - schemas are constants


def _prepare_closes(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Reshape a close object into the schema's shape (branches map -> list, conflict extras)."""
    out = dict(obj)
    branches = obj.get("branches")
    if isinstance(branches, Mapping):
        out["branches"] = [
            {**b, "branch": name} if isinstance(b, Mapping) else b
            for name, b in sorted(branches.items())
        ]
    conflicts = obj.get("conflicts")
    if isinstance(conflicts, list):
        out["conflicts"] = [_prepare_conflict(c) for c in conflicts]
    return out


def _prepare_conflict(conflict: Any) -> Any:
    if not isinstance(conflict, Mapping):
        return conflict
    extra = {k: v for k, v in conflict.items() if k not in _CONFLICT_FIELDS}
    out: dict[str, Any] = {k: conflict.get(k) for k in _CONFLICT_FIELDS}
    out["extra"] = extra or None
    return out


def to_row(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """Map one output object (docs/spec.md §5 layout) to a row of ``schema(kind)``; strict,
    lossless."""
    sch = schema(kind)
    if not isinstance(obj, Mapping):
        raise ValueError(f"{kind}: expected a JSON object")
    optional = {"raw_base64", "detail"} if kind == "dead_letter" else set()
    names = set(sch.names)
    missing = sorted(names - optional - obj.keys())
    unexpected = sorted(obj.keys() - names)
    if missing or unexpected:
        raise ValueError(f"{kind}: missing keys {missing}, unexpected keys {unexpected}")
    prepared = _prepare_closes(obj) if kind == "closes" else obj
    return {f.name: _convert(f, prepared.get(f.name), f.name) for f in sch}


def to_table(kind: str, objs: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Arrow table of ``schema(kind)`` holding ``to_row`` of each object, in input order."""
    return pa.Table.from_pylist([to_row(kind, o) for o in objs], schema=schema(kind))


def _bq_field(field: pa.Field) -> dict[str, Any]:
    typ, mode = field.type, "NULLABLE" if field.nullable else "REQUIRED"
    if pa.types.is_list(typ):
        typ, mode = typ.value_type, "REPEATED"
    out: dict[str, Any] = {"name": field.name, "mode": mode}
    if pa.types.is_struct(typ):
        out["type"] = "RECORD"
        out["fields"] = [_bq_field(f) for f in typ]
    else:
        out["type"] = ("TIMESTAMP" if pa.types.is_timestamp(typ)
                       else "INTEGER" if pa.types.is_integer(typ) else "STRING")
    out["description"] = field.metadata[b"description"].decode()
    return out


def bigquery_schema(kind: str) -> list[dict[str, Any]]:
    """BigQuery JSON schema (list of field dicts) with the same columns as ``schema(kind)``.

    JSON-text columns are ``STRING`` (query with ``JSON_VALUE``/``PARSE_JSON``); lists are
    ``REPEATED``; non-nullable columns are ``REQUIRED``. Partition ``closes`` by
    ``DATE(closed_at)``.
    """
    return [_bq_field(f) for f in schema(kind)]


def bigquery_schema_text(kind: str) -> str:
    """The committed file text of ``fanin/contracts/bigquery/<kind>.json`` (indented, newline)."""
    return json.dumps(bigquery_schema(kind), indent=2) + "\n"


def _bq_value(typ: pa.DataType, value: Any) -> Any:
    if value is None:
        return [] if pa.types.is_list(typ) else None  # BigQuery REPEATED is never NULL
    if pa.types.is_timestamp(typ):
        return format_ms(value)
    if pa.types.is_list(typ):
        return [_bq_value(typ.value_type, v) for v in value]
    if pa.types.is_struct(typ):
        return {f.name: _bq_value(f.type, value[f.name]) for f in typ}
    return value


def to_bigquery_row(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """``to_row`` with timestamps as RFC 3339 UTC text: a JSON-serialisable BigQuery row."""
    row = to_row(kind, obj)
    return {f.name: _bq_value(f.type, row[f.name]) for f in schema(kind)}
