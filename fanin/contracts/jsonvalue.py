"""Strict JSON decoding and JSON equality (docs/spec.md §1).

Guarantees:
- ``loads_strict`` refuses what docs/spec.md §1 says is not JSON: ``NaN``/``Infinity`` literals,
  numbers that overflow a double (``1e400``), integers of more than ``MAX_INT_DIGITS`` digits
  (or of more than this process's own digit limit, when it lowered Python's), objects
  with a
  repeated field name (at any depth), lone UTF-16 surrogate escapes (they cannot be written back
  as UTF-8), and nesting deeper than ``MAX_DEPTH``. Each refusal is a ``JSONRefused`` with a
  one-line reason.
- ``canonical`` maps a JSON value to a string such that two values are JSON-equal (numbers by
  value, ``1 == 1.0``; strings exactly; arrays in order; objects by their set of fields;
  ``true`` is not ``1``) exactly when their canonical strings are equal. The string is itself
  JSON, so "least canonical JSON" is a total, deterministic order.
- ``loads`` returns exactly what ``loads_strict`` returns, and refuses exactly what it refuses
  (with the same reason): it decodes with orjson only text that cannot hold anything orjson
  reads differently (see ``_loads_plain``), and hands everything else to ``loads_strict``.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import orjson

__all__ = ["JSON_WHITESPACE", "MAX_DEPTH", "MAX_INT_DIGITS", "JSONRefused", "canonical",
           "encode_str", "loads", "loads_strict", "output_json"]

MAX_DEPTH = 64
JSON_WHITESPACE = " \t\n\r"  # what JSON allows between tokens (RFC 8259), and nothing else


class JSONRefused(ValueError):
    """The text is not JSON as docs/spec.md §1 defines it."""


def _refuse_constant(name: str) -> Any:
    raise JSONRefused(f"{name} is not JSON")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise JSONRefused(f"repeated field name {name!r}")
            seen.add(name)
    return obj


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JSONRefused(f"number {text[:40]} is out of range")
    return value


MAX_INT_DIGITS = 4_300
"""The most digits an integer may have (docs/spec.md §1): Python's default limit, applied
whatever this process's ``sys.set_int_max_str_digits`` (or ``PYTHONINTMAXSTRDIGITS``) says,
so an agent that raised or lifted it does not send what ``fanin run`` refuses."""


def _int(text: str) -> int:
    if len(text) - text.startswith("-") > MAX_INT_DIGITS:
        raise JSONRefused(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)  # a process that lowered Python's limit refuses more (loads_strict)


_DECODER = json.JSONDecoder(
    object_pairs_hook=_pairs, parse_constant=_refuse_constant, parse_float=_float,
    parse_int=_int,
)


def _check(value: Any, depth: int) -> None:
    """Depth and surrogate check; only called when the text could contain either problem.
    ``depth``: the containers around ``value``; more than ``MAX_DEPTH`` containers nested
    are refused, whatever the innermost one holds (a scalar is not a level)."""
    if isinstance(value, (dict, list)) and depth >= MAX_DEPTH:
        raise JSONRefused(f"nesting deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        for name, item in value.items():
            _check(name, depth + 1)
            _check(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check(item, depth + 1)
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise JSONRefused("lone surrogate in a string") from None


def loads_strict(text: str) -> Any:
    """Decode ``text`` as strict JSON; raise ``JSONRefused`` with a reason otherwise."""
    try:
        value = _DECODER.decode(text)
    except JSONRefused:
        raise
    except RecursionError:
        raise JSONRefused(f"nesting deeper than {MAX_DEPTH}") from None
    except ValueError as exc:  # JSONDecodeError, and int digit-limit errors
        if "integer string conversion" in str(exc):  # Python's guard on huge integers
            raise JSONRefused(f"an integer of more than {sys.get_int_max_str_digits()} "
                              "digits") from None
        raise JSONRefused(str(exc).split("\n", 1)[0]) from None
    # Cheap gate for the rare cases: deep nesting needs many brackets, surrogates need "\u".
    if text.count("[") + text.count("{") > MAX_DEPTH or "\\u" in text or "\\U" in text:
        _check(value, 0)
    return value


def _classes() -> bytes:
    """Byte -> class: digits "9", JSON whitespace " ", the bytes the checks look for as
    themselves, every other byte "."."""
    table = bytearray(b"." * 256)
    table[ord("0"):ord("9") + 1] = b"9" * 10
    for byte in JSON_WHITESPACE.encode():
        table[byte] = ord(" ")
    for byte in b'\\:{["':
        table[byte] = byte
    table[ord("[")] = ord("{")
    return bytes(table)


_CLASSES = _classes()
_LONG_DIGITS = b"9" * 19
_NOT_PLAIN = object()


def _loads_plain(data: bytes) -> Any:
    """orjson's value of the UTF-8 ``data`` when it equals ``loads_strict``'s, else
    ``_NOT_PLAIN``.

    orjson refuses what ``loads_strict`` refuses among what is left here (NaN, Infinity,
    numbers that overflow a double, invalid UTF-8, lone surrogates, a byte order mark,
    trailing content); what it reads differently is a repeated field name (it keeps the
    last), an integer beyond 64 bits (a float), and nesting deeper than ``MAX_DEPTH``.

    Plain text has at most ``MAX_DEPTH`` brackets (no deep nesting), and either is compact
    (the common case): orjson's compact encoding of the value is ``data`` itself, so no field
    was dropped and no number changed; or has no backslash (so every ``"`` opens or closes a
    string), no whitespace before a ``:`` (so every field name ends in ``":``) and no run of
    19 digits; orjson's compact encoding writes ``":`` once per field it kept, so a
    repeated name shows as fewer ``":`` written back than read.
    """
    if data.count(b"{") + data.count(b"[") > MAX_DEPTH:
        return _NOT_PLAIN
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return _NOT_PLAIN
    written = orjson.dumps(value)
    if written == data:
        return value
    classes = data.translate(_CLASSES)
    if (b"\\" in classes or b" :" in classes or _LONG_DIGITS in classes
            or classes.count(b'":') != written.count(b'":')):
        return _NOT_PLAIN
    return value


def loads(text: str, data: bytes | None = None) -> Any:
    """``loads_strict(text)``; ``data``: ``text`` in UTF-8 when the caller has it. Plain text
    (``_loads_plain``) is decoded by orjson, the rest by ``loads_strict``."""
    value = _loads_plain(text.encode("utf-8", "surrogatepass") if data is None else data)
    return loads_strict(text) if value is _NOT_PLAIN else value


def _normalize(value: Any) -> Any:
    if value is True or value is False or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        return {name: _normalize(item) for name, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(item) for item in value]
    raise TypeError(f"not a JSON value: {type(value).__name__}")


_DUMPS = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
encode_str = json.encoder.encode_basestring
_SORTED = orjson.OPT_SORT_KEYS
_FRACTION = re.compile(rb"[0-9][.eE]")  # how orjson writes every float, and no integer


def _has_float(written: bytes) -> bool:
    """Whether orjson's compact output ``written`` holds a float: a digit followed by ``.``,
    ``e`` or ``E`` outside the strings (between the ``"`` of a text without a backslash,
    where every ``"`` opens or closes a string). With a backslash: assumed (the general path
    decides)."""
    if _FRACTION.search(written) is None:
        return False
    if b"\\" in written:
        return True
    return _FRACTION.search(b"".join(written.split(b'"')[::2])) is not None


def canonical(value: Any) -> str:
    """Canonical JSON text: sorted fields, integral numbers without fraction, no spaces.

    An array or object without a float is written by orjson, whose compact output with sorted
    fields is that text (the same string escapes; fields in code point order); the rest (a
    float anywhere, integers beyond 64 bits, lone surrogates) by the general encoder.
    """
    kind = type(value)
    if kind is str:
        return encode_str(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    if kind is float:
        return int.__repr__(int(value)) if value.is_integer() else float.__repr__(value)
    if kind is dict or kind is list:
        try:
            written = orjson.dumps(value, option=_SORTED)
        except orjson.JSONEncodeError:
            return _DUMPS(_normalize(value))
        if not _has_float(written):
            return written.decode("utf-8")
    return _DUMPS(_normalize(value))


def output_json(value: Any, sort_keys: bool = False) -> str:
    """The outputs' one spelling of a JSON value (docs/spec.md §1 "Numbers"): compact UTF-8
    JSON, fields in their order (or sorted by name), every number as orjson writes it (an
    integer's digits, a double in its shortest form: ``1e-7``, where the standard encoder
    writes ``1e-07``), an integer beyond 64 bits with its digits."""
    option = orjson.OPT_SORT_KEYS if sort_keys else 0
    try:
        return orjson.dumps(value, option=option).decode()
    except TypeError:  # an integer orjson refuses
        return orjson.dumps(_big_integers_as_digits(value), option=option).decode()


def _big_integers_as_digits(value: Any) -> Any:
    """``value`` with every integer outside orjson's range (-2^63 .. 2^64-1) as a fragment
    of its digits."""
    kind = type(value)
    if kind is dict:
        return {key: _big_integers_as_digits(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [_big_integers_as_digits(item) for item in value]
    if kind is int and not -2**63 <= value < 2**64:
        return orjson.Fragment(int.__repr__(value))
    return value
