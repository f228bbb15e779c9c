"""Conservation over arbitrary JSON. Generated traffic with arbitrary JSON in
``value`` and ``attempt`` (numbers of any size up to 400 digits, unicode, nesting up to and
beyond the depth limit), arbitrary times (years 1-9999, not times at all), hostile lines, and a
contract whose schema is drawn from valid, invalid and unresolvable ones. For each example:

- a contract that cannot load is refused by ``fanin run`` with one line and exit 2;
- otherwise the bounded run (JSONL and Parquet) and the replay both account for every input
  message exactly once (a close's ``counts.messages``, a late line or a dead letter), the
  Parquet files hold as many rows as the JSONL files, and ``fanin query`` and ``fanin report``
  succeed on both folders (never a traceback).

Examples: ``FANIN_RELIABILITY_EXAMPLES`` (default 12)."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanin.cli import main
from tests.reliability.runs import KINDS, accounted, messages, parquet_rows, read_jsonl

EXAMPLES = int(os.environ.get("FANIN_RELIABILITY_EXAMPLES", "12"))

big_ints = st.integers(-(10**400), 10**400)
scalars = (st.none() | st.booleans() | big_ints | st.integers(-5, 5)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=8)


@st.composite
def deep(draw: st.DrawFn) -> Any:
    """A value nested 55-70 levels (the limit is 64)."""
    value: Any = draw(scalars)
    for _ in range(draw(st.integers(55, 70))):
        value = [value] if draw(st.booleans()) else {"k": value}
    return value


values = json_values | deep()
attempts = st.none() | st.integers(-2, 3) | big_ints | st.just(2**63 - 1) | st.just(2**63) \
    | json_values
instants = st.datetimes().map(lambda d: f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:"
                              f"{d.minute:02d}:{d.second:02d}.{d.microsecond // 1000:03d}Z")
times = instants | instants | st.text(max_size=12) | big_ints | st.none()
hostile = st.sampled_from(["not json", "[]", "{}", '{"join_id":"j0","value":NaN}', "1e400",
                           '{"join_id":"j0","branch":"a","status":"ok","event_time":'
                           '"2026-01-01T00:00:00Z","value":"\\ud800"}', " "])
GOOD_SCHEMAS = [{"multipleOf": 0.01}, {"multipleOf": 3}, {"type": "integer"},
                {"maximum": 10**30}, {"$defs": {"n": {"type": "number"}}, "$ref": "#/$defs/n"},
                {"pattern": "^a"}, {"items": {"$ref": "#"}}, True]
BAD_SCHEMAS = [{"$ref": "#/$defs/nope"}, {"$ref": "https://example.com/s.json"},
               {"type": "nope"}]
schemas = st.sampled_from(GOOD_SCHEMAS + BAD_SCHEMAS) | st.builds(
    lambda v: {"const": v}, st.none() | st.booleans() | big_ints | st.text("abc", max_size=3))


@st.composite
def traffic(draw: st.DrawFn) -> list[str]:
    lines = []
    for j in range(draw(st.integers(1, 4))):
        join_id = f"j{j}"
        branches = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3,
                                 unique=True))
        contract = draw(st.sampled_from([None, "c", "missing"]))
        if draw(st.booleans()):
            opened = {"kind": "open", "join_id": join_id, "opened_at": draw(times),
                      "required": branches, "contract": contract}
            if draw(st.booleans()):
                opened["deadline_s"] = draw(st.floats(0.001, 1e13))
            lines.append(json.dumps(opened))
        for _ in range(draw(st.integers(0, 4))):
            receipt = {"join_id": join_id, "branch": draw(st.sampled_from([*branches, "x"])),
                       "status": draw(st.sampled_from(["ok", "error", "timeout", "skipped"])),
                       "event_time": draw(times), "key": draw(st.sampled_from([None, "amount"])),
                       "contract": contract, "value": draw(values)}
            if draw(st.booleans()):
                receipt["attempt"] = draw(attempts)
            lines.append(json.dumps(receipt, ensure_ascii=draw(st.booleans())))
    lines.extend(draw(st.lists(hostile, max_size=2)))
    return draw(st.permutations(lines))


def _cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(list(argv))
    return code, err.getvalue()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=traffic(), schema=schemas)
def test_every_message_is_accounted_for_and_every_tool_answers(
        tmp_path_factory: Any, lines: list[str], schema: Any) -> None:
    folder: Path = tmp_path_factory.mktemp("prop")
    source = folder / "in.jsonl"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    contracts = folder / "contracts.yaml"
    contracts.write_text(json.dumps({"contracts": [{"name": "c", "required": ["a"],
                                                    "schemas": {"amount": schema}}]}))
    common = ["run", "--input", str(source), "--contracts", str(contracts)]
    code, err = _cli(*common, "--output", str(folder / "bounded"), "--format", "jsonl",
                     "--format", "parquet")
    if schema in BAD_SCHEMAS:
        assert code == 2 and err.startswith("fanin: error: ") and err.count("\n") == 1, err
        return
    assert code == 0, err
    code, err = _cli(*common, "--output", str(folder / "replay"), "--replay")
    assert code == 0, err
    for out in ("bounded", "replay"):
        found = read_jsonl(folder / out)
        assert accounted(found) == messages(lines), out
        for argv in (["query", str(folder / out), "select count(*) from closes"],
                     ["report", str(folder / out)]):
            code, err = _cli(*argv)
            assert code == 0, (argv, err)
    found = read_jsonl(folder / "bounded")
    assert parquet_rows(folder / "bounded") == {kind: len(found[kind]) for kind in KINDS}
