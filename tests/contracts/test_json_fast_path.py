"""``jsonvalue.loads`` (orjson for plain text) is ``loads_strict``: same value, same types at
every depth, same refusal with the same reason, on generated JSON (compact and spaced, with
repeated field names, escapes, long digit runs, deep nesting) and on the fuzz corpus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanin.contracts.jsonvalue import MAX_DEPTH, canonical, loads, loads_strict

CORPUS = Path(__file__).resolve().parents[1] / "data" / "fuzz_corpus"
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(alphabet=st.characters(codec="utf-8"), max_size=8)
            | st.sampled_from(['a":b', "x :y", "{", "[", "\\", "\t", "é", "\U0001f600"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.sampled_from(["a", "b", "c", 'q"', "k :", "ü"]),
                                         inner, max_size=4), max_leaves=20)


def _outcome(decode: Any, text: str) -> Any:
    try:
        return ("value", _typed(decode(text)))
    except ValueError as exc:
        return ("refused", type(exc).__name__, str(exc))


def _typed(value: Any) -> Any:
    """The value with every scalar's type next to it (so 1 and 1.0 and True differ)."""
    if isinstance(value, dict):
        return ("dict", [(k, _typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    return (type(value).__name__, repr(value))


def _same(text: str) -> None:
    assert _outcome(loads, text) == _outcome(loads_strict, text), text


@SETTINGS
@given(_values, st.sampled_from([(",", ":"), (", ", ": "), (",", " : "), (",\n", ":\t")]),
       st.booleans())
def test_generated_values_decode_alike(value: Any, separators: tuple[str, str],
                                       ascii_only: bool) -> None:
    _same(json.dumps(value, separators=separators, ensure_ascii=ascii_only))


@SETTINGS
@given(_values, st.sampled_from(["a", "b", "k :"]), _scalars, st.integers(0, 3))
def test_repeated_field_names_are_refused_alike(value: Any, name: str, extra: Any,
                                                depth: int) -> None:
    inner = json.dumps({name: extra}, separators=(",", ":"))
    text = inner[:-1] + "," + inner[1:]  # {"name":x,"name":x}: the name twice
    for _ in range(depth):
        text = '{"v":' + json.dumps(value) + ',"w":' + text + "}"
    _same(text)
    assert _outcome(loads, text)[0] == "refused", text


def test_edge_texts_decode_alike() -> None:
    for text in ['{"a":1,"a":2}', '{"a" :1,"a":2}', '{"a":"\\":","a":1}', "1" * 19, "-" + "9" * 25,
                 "1e400", "-1e400", "NaN", "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
                 "[" * MAX_DEPTH + "]" * MAX_DEPTH, '"\\ud800"', "\ufeff{}", "{} x", "", " ",
                 '{"a":1}\n', "0.1000000000000000055511151231257827", "-0", "-0.0", "1E5",
                 # compact texts orjson writes back byte for byte (or nearly)
                 '{"a":"x\\"y","b":"\\\\","c":"\\n"}', '{"a":18446744073709551615}',
                 '{"a":18446744073709551616}', '{"a":-9223372036854775809}', '{"a":1.0}',
                 '{"a":[],"b":{}}', '{"a":"\\u00e9"}', '{"a":"\\ud83d\\ude00"}']:
        _same(text)


def test_fuzz_corpus_decodes_alike() -> None:
    files = sorted(CORPUS.glob("*.bin"))
    assert files
    for path in files:
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        _same(text)


def _reference_canonical(value: Any) -> str:
    """docs/spec.md's canonical JSON, by the standard library: integral numbers without a
    fraction, fields sorted, no spaces, non-ASCII as itself."""
    def normal(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, dict):
            return {k: normal(x) for k, x in v.items()}
        if isinstance(v, list):
            return [normal(x) for x in v]
        return v
    return json.dumps(normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_canon_values = st.recursive(
    _scalars | st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
    | st.sampled_from(["1.5", ":1.5", "[2e5", "x\u2028y", "\x1f\x7f", "a,-3.0"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(alphabet=st.characters(codec="utf-8"), max_size=4), inner, max_size=4),
    max_leaves=20)


@SETTINGS
@given(_canon_values)
def test_canonical_is_the_standard_librarys_canonical_json(value: Any) -> None:
    assert canonical(value) == _reference_canonical(value)


@SETTINGS
@given(_canon_values)
def test_canonical_of_a_decoded_message_value_is_that_of_the_value(value: Any) -> None:
    # the parse path: the value as decoded by ``loads`` (orjson for plain text)
    decoded = loads(json.dumps({"value": value}, ensure_ascii=False))["value"]
    assert canonical(decoded) == _reference_canonical(value)
