"""Property fuzzing of ``parse_message`` (docs/spec.md §1, §5 dead letters).

The one property everything here checks (``check_outcome``): ``parse_message`` never raises;
it returns exactly one of ``(record, None)`` or ``(None, dead_letter)``; a dead letter has an
``error`` in ``ERRORS``, a non-empty one-line ``detail``, ``raw`` equal to the input text (or a
``raw_base64`` that decodes to the input bytes), the ``source`` it was given, and can be
written as a UTF-8 output line; a record's ``RAW`` is the input text, it re-parses to the same
record, and standard ``json`` can read it back (``late/`` does).

Besides the generic property, several strategies carry an independent oracle (field types of
docs/spec.md §1's table, RFC 3339 validity computed with ``datetime``) so that wrong acceptances and
wrong refusals fail too. ``tests/data/fuzz_corpus/`` is replayed on every run: each file is one
exact input; its name ``<expected>--<label>.bin`` gives the expected outcome (``ok`` or an
error code).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fanin.contracts import records as R
from fanin.contracts.parsing import DEFAULT_MAX_BYTES, ERRORS, parse_message

CORPUS = Path(__file__).resolve().parents[1] / "data" / "fuzz_corpus"
CONTRACTS = frozenset({"triage", "review"})
SOURCE: dict[str, Any] = {"kind": "file", "file": "fuzz.jsonl", "line": 7}
T0 = "2026-01-01T00:00:00.000Z"

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check_outcome(data: bytes | str, source: dict[str, Any] = SOURCE,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[Any, Any]:
    """Run ``parse_message`` and assert the universal property; returns its result."""
    result = parse_message(data, source, CONTRACTS, max_bytes)
    assert isinstance(result, tuple) and len(result) == 2
    record, dead = result
    assert (record is None) != (dead is None), result
    text: str | None
    if isinstance(data, str):  # a str that is not valid Unicode is judged as its bytes
        try:
            data.encode("utf-8")
            text = data
        except UnicodeEncodeError:
            data, text = data.encode("utf-8", "surrogatepass"), None
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    if dead is not None:
        assert dead["error"] in ERRORS
        detail = dead["detail"]
        assert isinstance(detail, str) and detail.strip()
        assert "\n" not in detail and "\r" not in detail
        assert dead["source"] is source
        if text is not None:
            assert dead["raw"] == text
            assert "raw_base64" not in dead
        else:
            assert dead["error"] in ("not_utf8", "too_large")
            assert base64.b64decode(dead["raw_base64"], validate=True) == data
            assert isinstance(dead["raw"], str)
        json.dumps(dead, ensure_ascii=False).encode("utf-8")  # the writer can write it
        return result
    assert text is not None
    assert record[R.RAW] == text
    assert record[R.SOURCE] is source
    assert record[R.KIND] in (R.OPEN, R.RECEIPT)
    assert isinstance(record[R.JOIN_ID], str) and 1 <= len(record[R.JOIN_ID]) <= 256
    assert len(text.encode("utf-8")) <= max_bytes
    again, none = parse_message(record[R.RAW], source, CONTRACTS, max_bytes)
    assert none is None and again == record
    assert isinstance(json.loads(record[R.RAW]), dict)  # late/ re-reads the original
    return result


def expect(data: bytes | str, outcome: str, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """``check_outcome`` and the expected result: ``"ok"`` or a dead-letter error code."""
    record, dead = check_outcome(data, SOURCE, max_bytes)
    got = "ok" if record is not None else dead["error"]
    assert got == outcome, (data[:200], dead)


def receipt(**fields: Any) -> dict[str, Any]:
    return {"join_id": "j1", "branch": "a", "status": "ok", "event_time": T0, **fields}


def open_msg(**fields: Any) -> dict[str, Any]:
    return {"kind": "open", "join_id": "j1", "opened_at": T0, **fields}


def text_of(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


# ----------------------------------------------------------------------------- strategies
json_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                           max_leaves=12)
# spliced in as a field value: refused (not JSON, or out of range) / accepted
BAD_TOKENS = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "9" * 4400, "1" * 4301,
              "1.7976931348623157e309", "0x10", "+1", ".5", "01", "1.", "nul", "\"\\ud800\"",
              "\"\\udfff\\ud800\"", "[1,]", "{\"a\"}", "'a'", "\"\t\"")
GOOD_TOKENS = ("true", "[]", "{}", "\"\\u0000\"", "-0", "1E-400", "1" * 4300, "-0.0e-0")


@st.composite
def hostile_texts(draw: st.DrawFn) -> tuple[str, bool | None]:
    """A valid message mangled; returns (text, must be refused?) (None: either way)."""
    base = draw(st.sampled_from([text_of(receipt()), text_of(open_msg(required=["a", "b"])),
                                 text_of(receipt(value={"x": [1, 2, {"y": None}]}))]))
    how = draw(st.sampled_from(["truncate", "splice", "nest", "dup", "replace_value"]))
    if how == "truncate":
        cut = draw(st.integers(0, len(base)))
        return base[:cut], cut < len(base)
    if how == "splice":
        at = draw(st.integers(0, len(base)))
        return base[:at] + draw(st.sampled_from(BAD_TOKENS + GOOD_TOKENS)) + base[at:], None
    if how == "nest":
        depth = draw(st.integers(55, 3000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return (base[:-1] + ',"zv":' + opener * depth + "0" + closer * depth + "}",
                depth > 63)
    if how == "dup":
        depth = draw(st.integers(0, 70))
        inner = '{"k":1,"k":2}'
        for _ in range(depth):
            inner = '{"n":' + inner + "}"
        return base[:-1] + ',"zz":' + inner + "}", True
    bad = draw(st.booleans())
    token = draw(st.sampled_from(BAD_TOKENS if bad else GOOD_TOKENS))
    return base[:-1] + ',"zv":' + token + "}", bad


@given(st.binary(max_size=300))
@FUZZ
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    check_outcome(data)


@given(st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")))
@FUZZ
def test_arbitrary_text_bytes_never_raise(data: bytes) -> None:
    check_outcome(data)


@given(hostile_texts(), st.booleans())
@FUZZ
@example(('{"join_id":"j1","branch":"a","status":"ok","event_time":"' + T0 + '","value":NaN}',
          True), False)
def test_hostile_json_never_raises(case: tuple[str, bool | None], as_bytes: bool) -> None:
    text, refuse = case
    record, dead = check_outcome(text.encode("utf-8", "surrogatepass") if as_bytes else text)
    if refuse is True:
        assert dead is not None, f"accepted: {text[:120]}"
        assert dead["error"] in ("invalid_json", "not_utf8"), dead
    elif refuse is False:
        assert record is not None, dead


@given(st.one_of(st.integers(0, 5000), st.integers(60, 66)), st.sampled_from(["[", "{"]),
       st.sampled_from(["1", "[]", "{}"]))
@settings(max_examples=80, deadline=None)
def test_nesting_depth_boundary(depth: int, bracket: str, inner: str) -> None:
    opener, closer = ("[", "]") if bracket == "[" else ('{"a":', "}")
    nested = opener * depth + inner + closer * depth
    # at most 64 containers: the message object itself, the value's `depth` and an empty
    # innermost one (a scalar is not a level)
    containers = 1 + depth + (inner != "1")
    expect(text_of(receipt())[:-1] + ',"value":' + nested + "}",
           "ok" if containers <= 64 else "invalid_json")


@given(st.integers(0, 40), st.sampled_from(["obj", "arr"]))
@settings(max_examples=60, deadline=None)
def test_duplicate_keys_at_any_depth_are_refused(depth: int, wrapper: str) -> None:
    inner = '{"same":1,"same":1}'
    for _ in range(depth):
        inner = '{"w":' + inner + "}" if wrapper == "obj" else "[" + inner + "]"
    expect(text_of(receipt())[:-1] + ',"extra":' + inner + "}", "invalid_json")


@given(st.integers(4301, 6000), st.integers(309, 2000), st.booleans())
@settings(max_examples=40, deadline=None)
def test_huge_numbers(digits: int, exponent: int, negative: bool) -> None:
    sign = "-" if negative else ""
    base = text_of(receipt())[:-1]
    expect(base + ',"value":' + sign + "1" * digits + "}", "invalid_json")
    expect(base + ',"value":' + sign + f"1e{exponent}" + "}", "invalid_json")
    expect(base + ',"value":' + sign + f"1e-{exponent}" + "}", "ok")  # underflow is 0.0
    expect(base + ',"value":' + sign + "1" * 4300 + "}", "ok")


# ----------------------------------------------------------------------------- docs/spec.md §1
# table
def _time_ok(v: Any) -> bool:
    return isinstance(v, str) and v == T0


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and len(v) >= 1


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(_nonempty_str(x) for x in v)


def _number_gt0(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


# field -> (validity predicate for non-null values, may it be null/absent?)
RECEIPT_FIELDS: dict[str, tuple[Any, bool]] = {
    "join_id": (lambda v: _is_str(v) and 1 <= len(v) <= 256, False),
    "branch": (_nonempty_str, False),
    "status": (lambda v: v in ("ok", "error", "timeout", "skipped") and _is_str(v), False),
    "event_time": (_time_ok, False),
    "opened_at": (_time_ok, True),
    "key": (_is_str, True),
    "value": (lambda v: True, True),
    "error": (_is_str, True),
    "attempt": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, True),
    "run_id": (_is_str, True),
    "message_id": (_is_str, True),
}
OPEN_FIELDS: dict[str, tuple[Any, bool]] = {
    "join_id": RECEIPT_FIELDS["join_id"],
    "opened_at": (_time_ok, False),
    "required": (_names, True),
    "optional": (lambda v: _names(v) and "a" not in v and "b" not in v, True),
    "deadline_s": (_number_gt0, True),
    "allow_partial": (lambda v: isinstance(v, bool), True),
    "fail_fast": (lambda v: isinstance(v, bool), True),
    "run_id": (_is_str, True),
    "message_id": (_is_str, True),
}
RECEIPT_IGNORED = ("required", "optional", "deadline_s", "allow_partial", "fail_fast")
OPEN_IGNORED = ("branch", "status", "event_time", "key", "value", "error", "attempt")
WRONG_TYPES: tuple[Any, ...] = (1, 0, -3, 1.5, 2.0, "x", "", "false", "30", True, False, [],
                                ["a"], [1], {}, {"a": 1}, None, T0, "2026-01-01 00:00:00Z")

TABLE_CASES = [("receipt", f, v) for f in RECEIPT_FIELDS for v in WRONG_TYPES] + \
    [("open", f, v) for f in OPEN_FIELDS for v in WRONG_TYPES]


def _expected(kind: str, field: str, value: Any) -> str:
    table = RECEIPT_FIELDS if kind == "receipt" else OPEN_FIELDS
    valid, nullable = table[field]
    if value is None:
        return "ok" if nullable else "invalid_message"
    return "ok" if valid(value) else "invalid_message"


@pytest.mark.parametrize(("kind", "field", "value"), TABLE_CASES)
def test_every_table_field_with_every_json_type(kind: str, field: str, value: Any) -> None:
    base = receipt() if kind == "receipt" else open_msg(required=["a", "b"])
    expect(text_of({**base, field: value}), _expected(kind, field, value))


@given(st.sampled_from(["receipt", "open"]), st.data())
@FUZZ
def test_table_fields_against_an_oracle(kind: str, data: st.DataObject) -> None:
    table = RECEIPT_FIELDS if kind == "receipt" else OPEN_FIELDS
    field = data.draw(st.sampled_from(sorted(table)))
    value = data.draw(json_values)
    base = receipt() if kind == "receipt" else open_msg(required=["a", "b"])
    expect(text_of({**base, field: value}), _expected(kind, field, value))


@given(st.sampled_from(["receipt", "open"]), st.data())
@FUZZ
def test_ignored_and_unknown_fields_are_accepted_and_kept(kind: str,
                                                          data: st.DataObject) -> None:
    ignored = RECEIPT_IGNORED if kind == "receipt" else OPEN_IGNORED
    extra = data.draw(st.dictionaries(
        st.text(string.ascii_lowercase + "_", min_size=1, max_size=8).filter(
            lambda k: k not in RECEIPT_FIELDS and k not in OPEN_FIELDS
            and k not in ("kind", "contract")) | st.sampled_from(ignored),
        json_values, max_size=5))
    base = receipt() if kind == "receipt" else open_msg(required=["a", "b"])
    text = text_of({**base, **extra})
    record, _ = check_outcome(text)
    assert record is not None
    assert json.loads(record[R.RAW]) == {**base, **extra}


@pytest.mark.parametrize(("contract", "outcome"), [
    ("triage", "ok"), ("review", "ok"), ("nope", "unknown_contract"), ("", "invalid_message"),
    (1, "invalid_message"), (None, "ok"), ("Triage", "unknown_contract")])
@pytest.mark.parametrize("kind", ["receipt", "open"])
def test_contract_field(kind: str, contract: Any, outcome: str) -> None:
    base = receipt() if kind == "receipt" else open_msg()
    expect(text_of({**base, "contract": contract}), outcome)


# ----------------------------------------------------------------------------- timestamps
@st.composite
def timestamps(draw: st.DrawFn) -> tuple[str, int | None]:
    """An RFC 3339-shaped string with possibly bad parts, and its epoch ms by ``datetime``."""
    year = draw(st.integers(0, 10000))
    month, day = draw(st.integers(0, 13)), draw(st.integers(0, 32))
    hour, minute = draw(st.integers(0, 25)), draw(st.integers(0, 61))
    second = draw(st.integers(0, 61))
    frac = draw(st.text("0123456789", max_size=9))
    zone = draw(st.sampled_from(["Z", "z", "+", "-", "", "none"]))
    oh, om = draw(st.integers(0, 25)), draw(st.integers(0, 61))
    sep = draw(st.sampled_from(["T", "t", "T", " "]))
    zone_text = {"+": f"+{oh:02d}:{om:02d}", "-": f"-{oh:02d}:{om:02d}", "none": ""}.get(
        zone, zone)
    text = (f"{year:04d}-{month:02d}-{day:02d}{sep}{hour:02d}:{minute:02d}:{second:02d}"
            + (f".{frac}" if frac else "") + zone_text)
    expected: int | None = None
    try:
        if sep == " " or zone in ("", "none") or second > 60 or year > 9999:
            raise ValueError
        if zone in ("+", "-"):
            if oh > 23 or om > 59:
                raise ValueError
            sign = 1 if zone == "+" else -1
            tz = dt.timezone(sign * dt.timedelta(hours=oh, minutes=om))
        else:
            tz = dt.timezone.utc
        leap = second == 60
        stamp = dt.datetime(year, month, day, hour, minute, 59 if leap else second, tzinfo=tz)
        millis = 999 if leap else int((frac + "000")[:3]) if frac else 0
        utc = stamp.astimezone(dt.timezone.utc)  # OverflowError beyond years 1-9999
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        expected = (utc - epoch) // dt.timedelta(milliseconds=1) + millis
    except (ValueError, OverflowError):
        expected = None
    return text, expected


@given(timestamps(), st.sampled_from(["event_time", "opened_at"]))
@settings(max_examples=400, deadline=None)
def test_timestamps_against_datetime(case: tuple[str, int | None], field: str) -> None:
    text, expected = case
    message = receipt(**{field: text}) if field == "event_time" else open_msg(opened_at=text)
    record, dead = check_outcome(text_of(message))
    if expected is None:
        assert dead is not None and dead["error"] == "invalid_message", (text, record)
        assert field in dead["detail"]
    else:
        assert record is not None, (text, dead)
        assert record[R.TIME] == expected


@pytest.mark.parametrize("stamp", ["\uff12\uff10\uff12\uff16-01-01T00:00:00Z",
                                   "2026-01-01T00:00:00.\u0661\u0662\u0663Z",
                                   "2026-01-01T00:00:00+\u0660\u0661:00"])
def test_non_ascii_digits_in_times_are_refused(stamp: str) -> None:
    expect(text_of(receipt(event_time=stamp)), "invalid_message")


# ----------------------------------------------------------------------------- size limit
def _padded(size: int, filler: str) -> bytes:
    """A valid receipt of exactly ``size`` UTF-8 bytes (``filler`` is 1 or 2 bytes)."""
    head = text_of(receipt(pad=""))
    room = size - len(head.encode("utf-8"))
    width = len(filler.encode("utf-8"))
    pad = filler * (room // width) + "x" * (room % width)
    data = text_of(receipt(pad=pad)).encode("utf-8")
    assert len(data) == size
    return data


@given(st.integers(120, 5000), st.sampled_from(["x", "\u00e9"]), st.booleans())
@settings(max_examples=60, deadline=None)
def test_exactly_at_the_size_limit_and_one_byte_over(limit: int, filler: str,
                                                     as_text: bool) -> None:
    at, over = _padded(limit, filler), _padded(limit + 1, filler)
    if as_text:
        expect(at.decode(), "ok", limit)
        expect(over.decode(), "too_large", limit)
    else:
        expect(at, "ok", limit)
        expect(over, "too_large", limit)


def test_default_size_limit_is_256_kib() -> None:
    assert DEFAULT_MAX_BYTES == 256 * 1024
    expect(_padded(DEFAULT_MAX_BYTES, "\u00e9"), "ok")
    expect(_padded(DEFAULT_MAX_BYTES + 1, "\u00e9"), "too_large")
    expect(_padded(DEFAULT_MAX_BYTES + 1, "x").decode(), "too_large")
    big = b"\xff" * (DEFAULT_MAX_BYTES + 1)  # too large and not UTF-8: exact bytes kept
    _record, dead = check_outcome(big)
    assert dead["error"] == "too_large" and "raw_base64" in dead


# ----------------------------------------------------------------------------- str input
@pytest.mark.parametrize("text", [
    text_of(receipt(value="\ud800")),
    text_of(receipt(pad="\udc00" * 70_000)),
])
def test_str_input_with_lone_surrogates(text: str) -> None:
    expect(text, "not_utf8")


# ----------------------------------------------------------------------------- corpus
CORPUS_FILES = sorted(CORPUS.glob("*.bin"))


def test_corpus_is_present_and_named() -> None:
    assert len(CORPUS_FILES) >= 50
    outcomes = {p.stem.split("--", 1)[0] for p in CORPUS_FILES}
    assert outcomes <= {"ok", *ERRORS}
    assert {"ok", "not_utf8", "invalid_json", "not_object", "invalid_message",
            "unknown_contract"} <= outcomes


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in CORPUS_FILES])
def test_corpus_replays(path: Path) -> None:
    data = path.read_bytes()
    outcome = path.stem.split("--", 1)[0]
    expect(data, outcome)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    expect(text, outcome)  # the str entry point agrees with the bytes one
