"""JSON Schema validators of contract ``schemas`` (draft 2020-12) that never fetch and never
raise on a value.

Guarantees:
- ``check_schema(schema)`` raises ``ValueError`` (one line) for an invalid schema, or one with
  a ``$ref``/``$dynamicRef`` that does not resolve inside the schema itself or to a JSON Schema
  meta-schema (a remote ``https://`` ref is refused, never fetched).
- ``validator_for(schema)`` resolves references only inside the schema (and the meta-schemas):
  nothing is ever retrieved from the network (jsonschema's default registry would fetch).
  ``check_schema`` also refuses a schema that recurses without end on a plain value (a
  ``$ref`` cycle), and ``first_error`` reports one that does so on some other value as a
  violation instead of raising.
- ``multipleOf`` is exact on the numbers' decimal values (a float by its shortest decimal
  form, ``repr``; an integer of any size as it is), as JSON Schema defines it: ``19.99`` is a
  multiple of ``0.01`` and ``0.3`` of ``0.1`` (jsonschema's float division says neither), an
  integer of hundreds of digits is checked like any other, and the check never raises.
- Regular expressions (``pattern``, ``patternProperties``, and the latter where
  ``additionalProperties`` uses it) run on RE2, in time linear in the value: no value stalls a
  check (Python's backtracking ``re`` takes time exponential in 40 characters of
  ``"aaa...!"`` against ``^(a+)+$``). RE2's classes are ASCII (``\\d`` is ``[0-9]``), as
  ECMA-262's, the dialect JSON Schema names. ``check_schema`` refuses a pattern RE2 cannot
  run (lookarounds, backreferences; one line with RE2's reason), and ``unevaluatedProperties``
  in a schema with ``patternProperties``, whose check would match names with ``re``.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any
from urllib.parse import urljoin

import jsonschema
from jsonschema import validators
from jsonschema_specifications import REGISTRY as SPECIFICATIONS
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012

from fanin.contracts.jsonvalue import canonical

__all__ = ["check_schema", "first_error", "validator_for"]

_BASE = jsonschema.Draft202012Validator
_REF_KEYS = ("$ref", "$dynamicRef")
_DATA_NAMES = ("const", "default", "enum", "examples")
_DATA_KEYWORDS = frozenset(_DATA_NAMES)  # values, not schemas
# maps from names (of properties, patterns, definitions) to subschemas
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                            "dependentSchemas"})


def _refuse(uri: str) -> Resource:
    raise NoSuchResource(uri)


def _exact(number: int | float) -> Fraction:
    """The decimal value of a JSON number as parsed: a float by its shortest form."""
    return Fraction(Decimal(repr(number))) if isinstance(number, float) else Fraction(number)


def _multiple_of(validator: Any, divisor: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "number") and \
            (_exact(instance) / _exact(divisor)).denominator != 1:
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {divisor!r}")


@functools.cache
def _re2() -> tuple[Any, Any]:
    """RE2's module and the options Fanin compiles with, imported at the first pattern (an
    import of ~90 ms that a run whose contracts have no pattern never pays)."""
    import re2

    options = re2.Options()
    options.log_errors = False  # a pattern it refuses is reported once, by check_schema
    return re2, options


# ECMA-262's \uXXXX escape (an even number of backslashes before it), which RE2 writes \x{XXXX}
_U_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u([0-9A-Fa-f]{4})")


@functools.lru_cache(maxsize=4096)
def _regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (``re2.error`` if it cannot run it), its ``\\uXXXX``
    escapes as RE2 writes them."""
    re2, options = _re2()
    return re2.compile(_U_ESCAPE.sub(r"\1\\x{\2}", pattern), options)


def _matches(pattern: str, text: str) -> bool:
    return _regex(pattern).search(text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _matches(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any,
                        schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if _matches(pattern, name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any,
                           schema: dict[str, Any]) -> Iterator[Any]:
    """jsonschema's ``additionalProperties``, its ``patternProperties`` matched by RE2."""
    if not validator.is_type(instance, "object"):
        return
    named, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
    extras = [name for name in instance
              if name not in named and not any(_matches(p, name) for p in patterns)]
    if validator.is_type(extra, "object"):
        for name in extras:
            yield from validator.descend(instance[name], extra, path=name)
    elif not extra and extras:
        names = ", ".join(repr(name) for name in sorted(extras))
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            regexes = ", ".join(repr(p) for p in sorted(patterns))
            yield jsonschema.ValidationError(
                f"{names} {verb} not match any of the regexes: {regexes}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield jsonschema.ValidationError(
                f"Additional properties are not allowed ({names} {verb} unexpected)")


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """jsonschema's ``uniqueItems`` in time linear in the value: items compared by their
    canonical JSON (JSON equality: ``1`` equals ``1.0``, ``true`` is not ``1``, fields in any
    order), where jsonschema compared every pair of items it could not sort (8,000 objects
    took a minute)."""
    if unique and validator.is_type(instance, "array") and \
            len({canonical(item) for item in instance}) != len(instance):
        yield jsonschema.ValidationError(f"{instance!r} has non-unique elements")


_Validator = validators.extend(_BASE, {
    "multipleOf": _multiple_of, "pattern": _pattern, "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties, "uniqueItems": _unique_items})


def _registry(schema: Any) -> tuple[Registry, str]:
    """A registry holding only ``schema`` (and the meta-schemas) that retrieves nothing, and
    the schema's base URI."""
    base = schema.get("$id", "") if isinstance(schema, dict) else ""
    resource = Resource.from_contents(schema, default_specification=DRAFT202012)
    registry = SPECIFICATIONS.combine(Registry(retrieve=_refuse))  # type: ignore[call-arg]
    return registry.with_resource(base, resource).crawl(), base


def validator_for(schema: Any) -> Any:
    """A draft 2020-12 validator of ``schema`` that never fetches and never raises."""
    registry, _ = _registry(schema)
    return _Validator(schema, registry=registry)


def _refs(node: Any, base: str) -> Iterator[str]:
    """Every reference in ``node`` made absolute against the ``$id``s around it."""
    if isinstance(node, dict):
        if isinstance(node.get("$id"), str):
            base = urljoin(base, node["$id"])
        for key, value in node.items():
            if key in _REF_KEYS and isinstance(value, str):
                yield urljoin(base, value)
            elif key not in _DATA_KEYWORDS:
                yield from _refs(value, base)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item, base)


def check_schema(schema: Any) -> None:
    """Raise ``ValueError`` if ``schema`` is invalid or has a reference that does not resolve
    locally."""
    try:
        _BASE.check_schema(schema)
    except jsonschema.SchemaError as exc:
        message = exc.message if len(exc.message) <= 300 else f"{exc.message[:300]}..."
        raise ValueError(f"not a valid JSON Schema: {message}") from None
    registry, base = _registry(schema)
    resolver = registry.resolver(base)
    schemas = {id(node) for node in _schema_objects(schema)}
    others = set(_containers(schema)) - schemas  # values, and maps that name subschemas
    for ref in _refs(schema, base):
        try:
            target = resolver.lookup(ref).contents
        except Unresolvable:
            raise ValueError(f"$ref {ref!r} does not resolve within the schema (remote "
                             "references are not fetched)") from None
        if not isinstance(target, (dict, bool)) or id(target) in others:
            raise ValueError(f"$ref {ref!r} points into a value ({', '.join(_DATA_NAMES)}) or "
                             "at what is not a schema")
    _check_regexes(schema)
    validator = validator_for(schema)
    for probe in _PROBES:  # a $ref cycle that consumes nothing of the value never ends
        if _errors(validator, probe) is _ENDLESS:
            raise ValueError("the schema refers to itself without end (a $ref cycle)")


def _check_regexes(schema: Any) -> None:
    """Every regular expression of ``schema`` runs on RE2 (see the module docstring)."""
    objects = list(_schema_objects(schema))
    keywords = {keyword for node in objects for keyword in node}
    if "unevaluatedProperties" in keywords and "patternProperties" in keywords:
        raise ValueError("unevaluatedProperties with patternProperties is not supported (its "
                         "check would match names with a backtracking regular expression)")
    patterns: list[str] = []  # each object's pattern, then its patternProperties' names
    for node in objects:
        if isinstance(node.get("pattern"), str):
            patterns.append(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            patterns.extend(node["patternProperties"])
    for pattern in patterns:
        try:
            _regex(pattern)
        except _re2()[0].error as exc:
            reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) \
                else str(exc)
            raise ValueError(f"pattern {pattern[:100]!r} cannot be checked in linear time "
                             f"(RE2: {reason}; lookarounds and backreferences are not "
                             "supported)") from None


def _schema_objects(node: Any) -> Iterator[dict[str, Any]]:
    """``node`` and every object under it whose keys are keywords: not the values of data
    keywords, nor the maps that name subschemas (``properties``, ``$defs``, ...), whose
    values are."""
    if isinstance(node, dict):
        yield node
        for key, value in node.items():
            if key in _NAMED_SCHEMAS and isinstance(value, dict):
                for subschema in value.values():
                    yield from _schema_objects(subschema)
            elif key not in _DATA_KEYWORDS:
                yield from _schema_objects(value)
    elif isinstance(node, list):
        for item in node:
            yield from _schema_objects(item)


def _containers(node: Any) -> Iterator[int]:
    """The ids of every object and array in ``node``, ``node`` included (a ``$ref`` may take
    one for a schema only where ``_schema_objects`` finds it)."""
    if isinstance(node, (dict, list)):
        yield id(node)
        for item in node.values() if isinstance(node, dict) else node:
            yield from _containers(item)


_PROBES: tuple[Any, ...] = (None, True, 0, 0.5, "", [], {})
_ENDLESS = "the schema refers to itself without end on this value"


# Python frames a value's check may use (a check deeper than this is ``_ENDLESS``), counted
# from its caller's frame: the answer never depends on how deep the caller is (a join decided
# in the close step's ``process``, at its bundle's end, or in a forked helper)
CHECK_FRAMES = 900
_CHECKING = threading.Lock()  # the recursion limit is the interpreter's: one check at a time


def first_error(validator: Any, value: Any) -> str | None:
    """The first schema error of ``value`` (at most 500 characters), or None. Never raises:
    a schema that recurses without end on ``value`` is an error of its own, and so is a check
    that needs more than ``CHECK_FRAMES`` Python frames, wherever it is called from."""
    problem = _errors(validator, value)
    return None if problem is None else problem[:500]


def _depth() -> int:
    """Frames on this thread's stack."""
    frame, depth = sys._getframe(1), 1
    while frame.f_back is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def _errors(validator: Any, value: Any) -> str | None:
    with _CHECKING:
        before = sys.getrecursionlimit()
        sys.setrecursionlimit(_depth() + CHECK_FRAMES)
        try:
            error = next(iter(validator.iter_errors(value)), None)
        except RecursionError:
            return _ENDLESS
        except BaseException as exc:
            if _out_of_stack_in_rust(exc):
                return _ENDLESS
            raise
        finally:
            sys.setrecursionlimit(before)
    return None if error is None else str(error.message)


def _out_of_stack_in_rust(exc: BaseException) -> bool:
    """Whether ``exc`` is a Rust extension's panic (``pyo3_runtime.PanicException``) over a
    ``RecursionError`` in a Python call it made: ``referencing`` keeps resolved references in
    ``rpds`` maps, whose key comparisons call ``__eq__``, so a check that runs out of stack
    there ends as that panic instead (it failed a contracts file's probe in CI, by where the
    limit fell)."""
    return type(exc).__module__ == "pyo3_runtime" and "RecursionError" in str(exc)
