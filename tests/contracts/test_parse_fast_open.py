"""The hand-written open check (``parsing._fast_open``) gives exactly the pydantic path's result:
for generated opens with fields of every JSON type, ``parse_message`` returns the same record or
the same dead letter with ``_fast_open`` as with it switched off (every open through
``OpenMessage``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanin.contracts import parsing
from fanin.contracts.parsing import parse_message

SOURCE = ("fuzz.jsonl", 3)
CONTRACTS = frozenset({"triage"})

_any = (st.none() | st.booleans() | st.integers(-(2**60), 2**60)
        | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=4)
        | st.lists(st.text(max_size=3), max_size=3))
_names = st.none() | st.lists(st.sampled_from(["a", "b", "c", ""]), max_size=4) | _any
_fields = {
    "join_id": st.text(min_size=0, max_size=3) | st.just("j" * 257) | _any,
    "opened_at": st.sampled_from(["2026-01-01T00:00:00.000Z", "2026-01-01T00:00:00+02:00",
                                  "2026-02-30T00:00:00Z", "yesterday"]) | _any,
    "contract": st.sampled_from(["triage", "other", ""]) | _any,
    "run_id": _any, "message_id": _any, "required": _names, "optional": _names,
    "deadline_s": st.sampled_from([30, 30.0, 0, 0.0, -0.0, -1, 2**53, 2**63, 1e308, 0.0005]) | _any,
    "allow_partial": _any, "fail_fast": _any,
}


@st.composite
def _opens(draw: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"kind": "open"}
    for name, strategy in _fields.items():
        if draw(st.booleans()):
            obj[name] = draw(strategy)
    return obj


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_opens())
def test_fast_open_equals_pydantic_path(obj: dict[str, Any]) -> None:
    text = json.dumps(obj)
    fast = parse_message(text, SOURCE, CONTRACTS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parsing, "_fast_open", lambda *args: None)
        strict = parse_message(text, SOURCE, CONTRACTS)
    assert fast == strict
