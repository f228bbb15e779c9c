"""Record builders for tests: the example contracts, times after a test epoch, messages."""

from __future__ import annotations

import json
from typing import Any

from fanin.contracts.catalog import Catalog, JoinDefaults, parse_contracts
from fanin.contracts.parsing import parse_message
from fanin.contracts.records import Record

__all__ = ["BASE", "CONTRACTS_YAML", "make_catalog", "nested", "open_msg", "receipt", "record",
           "records", "stack_hungry_schema", "ts"]

CONTRACTS_YAML = """
contracts:
  - name: triage
    required: [retrieve, verify, rank]
    optional: [enrich]
    deadline_s: 30
    allow_partial: true
    schemas:
      score: {type: number, minimum: 0, maximum: 1}
  - name: strict
    required: [a, b]
    deadline_s: 10
  - name: routed
    required: [classify, review/legal, review/tech, answer]
    deadline_s: 60
  - name: watch
    required: [a, b]
    deadline_s: 10
    close_trigger: watermark
  - name: short
    required: [a, b]
    deadline_s: 10
    retention_s: 5
  - name: fast
    required: [a, b]
    deadline_s: 10
    fail_fast: true
"""

BASE = "2026-01-01T00:00:00"


def ts(seconds: float) -> str:
    """RFC 3339 time ``seconds`` after the test epoch (millisecond precision)."""
    whole = int(seconds)
    millis = round((seconds - whole) * 1000)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    return f"2026-01-01T{hours:02d}:{minutes:02d}:{secs:02d}.{millis:03d}Z"


def make_catalog(**defaults: Any) -> Catalog:
    return Catalog(parse_contracts(CONTRACTS_YAML), JoinDefaults(**defaults))


def open_msg(join_id: str = "j", at: float = 0, **fields: Any) -> dict[str, Any]:
    return {"kind": "open", "join_id": join_id, "opened_at": ts(at), **fields}


def receipt(branch: str, at: float, join_id: str = "j", status: str = "ok",
            **fields: Any) -> dict[str, Any]:
    return {"join_id": join_id, "branch": branch, "status": status, "event_time": ts(at),
            **fields}


def record(message: dict[str, Any], catalog: Catalog | None = None, line: int = 0) -> Record:
    names = (catalog or make_catalog()).contracts
    rec, dead = parse_message(json.dumps(message), {"kind": "test", "line": line}, names)
    assert dead is None, dead
    return rec


def records(messages: list[dict[str, Any]], catalog: Catalog | None = None) -> list[Record]:
    return [record(m, catalog, i) for i, m in enumerate(messages)]


def stack_hungry_schema() -> dict[str, Any]:
    """A number, or an array of these, through a ``$ref`` wrapped in eight ``allOf``/``anyOf``
    layers: checking a value nested N arrays deep takes Python frames in proportion to N
    (~40 deep runs out of a 1,000-frame stack)."""
    layer: dict[str, Any] = {"$ref": "#/$defs/n"}
    for i in range(8):
        layer = {"allOf": [layer]} if i % 2 == 0 else {"anyOf": [layer]}
    return {"$defs": {"n": {"anyOf": [{"type": "number"}, {"type": "array", "items": layer}]}},
            "$ref": "#/$defs/n"}


def nested(depth: int) -> Any:
    """``1`` inside ``depth`` arrays."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value
