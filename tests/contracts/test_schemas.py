"""Regular expressions of contract schemas (``fanin.contracts.schemas``) run on RE2, and
``uniqueItems`` compares canonical JSON: no value stalls a check, patterns RE2 cannot run are
refused when the contracts load, and every other error is jsonschema's own."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from support.builders import nested, stack_hungry_schema

from fanin.contracts.schemas import check_schema, first_error, validator_for

BACKTRACKS = "^(a+)+$"
STALLS = "a" * 40 + "!"  # about 2**40 steps for Python's backtracking re against BACKTRACKS


def test_a_backtracking_pattern_checks_any_value_in_linear_time() -> None:
    validator = validator_for({"type": "string", "pattern": BACKTRACKS})
    assert first_error(validator, STALLS) == f"{STALLS!r} does not match {BACKTRACKS!r}"
    assert first_error(validator, "a" * 40) is None
    names = validator_for({"type": "object", "propertyNames": {"pattern": BACKTRACKS}})
    assert first_error(names, {STALLS: 1}) == f"{STALLS!r} does not match {BACKTRACKS!r}"


def test_unique_items_checks_a_large_array_in_linear_time(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """``uniqueItems`` on an array of objects near the message size limit (256 KiB): items
    compared by canonical JSON (jsonschema compared every pair it could not sort: about 8
    minutes of CPU for this value, a stalled join). jsonschema's pairwise check is made to
    fail here, so a return to it fails the test at once instead of after minutes."""
    def pairwise(container: Any) -> bool:
        raise AssertionError("jsonschema's pairwise uniqueItems check was used")

    monkeypatch.setattr(jsonschema._utils, "uniq", pairwise)
    validator = validator_for({"uniqueItems": True})
    distinct = [{"a": i} for i in range(23_000)]
    assert first_error(validator, distinct) is None
    assert first_error(validator, [*distinct, {"a": 22_999.0}]) is not None


def test_property_names_are_matched_in_linear_time() -> None:
    validator = validator_for({"type": "object", "additionalProperties": False,
                               "patternProperties": {BACKTRACKS: {"type": "integer"}}})
    assert first_error(validator, {"a" * 40: 1}) is None
    assert first_error(validator, {"a" * 40: "x"}) == "'x' is not of type 'integer'"
    assert first_error(validator, {STALLS: 1}) == \
        f"{STALLS!r} does not match any of the regexes: {BACKTRACKS!r}"


ORDINARY: list[tuple[dict[str, Any], Any]] = [
    ({"pattern": "^[a-z]+-[0-9]{2}$"}, "abc-12"),
    ({"pattern": "^[a-z]+-[0-9]{2}$"}, "abc-123"),
    ({"pattern": "b"}, "abc"),  # a search, not a full match
    ({"pattern": "x"}, 12),  # not a string: not checked
    ({"properties": {"a": {"type": "integer"}}, "additionalProperties": False},
     {"a": 1, "z": 2, "y": 3}),
    ({"properties": {"a": {}}, "additionalProperties": {"type": "string"}}, {"a": 1, "b": 2}),
    ({"patternProperties": {"^x": {"minimum": 3}, "y$": {"type": "string"}}},
     {"x1": 5, "ay": "s", "xy": "s"}),
    ({"patternProperties": {"^x": {"minimum": 3}}}, {"x1": 1}),
    ({"patternProperties": {"^x": {}}, "additionalProperties": False}, {"x1": 1, "b": 2}),
    ({"patternProperties": {"^x": {}}, "additionalProperties": False}, {"x1": 1, "b": 2, "c": 3}),
    ({"patternProperties": {"^x": {}}, "additionalProperties": False}, {"x1": 1}),
    *(({"uniqueItems": True}, items) for items in (
        [1, 1.0], [True, 1], [0, False], [None, False], [{"a": 1, "b": 2}, {"b": 2, "a": 1}],
        [[1], [1.0]], [0.0, -0.0], [1e20, 10**20], [{"a": [1, {"x": True}]}, {"a": [1, {"x": 1}]}],
        ["a", "b", "a"], [], "not an array")),
    ({"uniqueItems": False}, [1, 1]),
    # ECMA-262's \uXXXX escapes, which RE2 writes \x{XXXX} (refused before: "cannot be checked
    # in linear time"); an escaped backslash before "u" is a backslash and a "u"
    *(({"pattern": "^[\\u0000-\\u007f]*$"}, text) for text in ("abc", "é")),
    *(({"pattern": "^\\\\u0041$"}, text) for text in ("\\u0041", "A")),
]


@pytest.mark.parametrize(("schema", "value"), ORDINARY)
def test_errors_are_jsonschemas_on_ordinary_patterns(schema: dict[str, Any], value: Any) -> None:
    theirs = next(iter(jsonschema.Draft202012Validator(schema).iter_errors(value)), None)
    assert first_error(validator_for(schema), value) == \
        (None if theirs is None else theirs.message)


@pytest.mark.parametrize("pattern", ["^(?=a)b", "(?<!a)b", r"(a)\1", "(?P<x>a)(?P=x)"])
@pytest.mark.parametrize("where", ["pattern", "patternProperties", "propertyNames"])
def test_a_pattern_re2_cannot_run_is_refused_when_the_schema_loads(pattern: str,
                                                                   where: str) -> None:
    schema: dict[str, Any] = {
        "pattern": {"pattern": pattern},
        "patternProperties": {"patternProperties": {pattern: {}}},
        "propertyNames": {"$defs": {"n": {"pattern": pattern}},
                          "propertyNames": {"$ref": "#/$defs/n"}}}[where]
    with pytest.raises(ValueError) as refused:
        check_schema(schema)
    assert str(refused.value).startswith(f"pattern {pattern!r} cannot be checked in linear "
                                         "time (RE2: ")
    assert "\n" not in str(refused.value)


def test_unevaluated_properties_with_pattern_properties_is_refused() -> None:
    with pytest.raises(ValueError, match="unevaluatedProperties with patternProperties"):
        check_schema({"allOf": [{"patternProperties": {"^x": {}}}],
                      "unevaluatedProperties": False})
    check_schema({"unevaluatedProperties": False, "properties": {"x": {}}})  # either alone
    check_schema({"patternProperties": {"^x": {}},  # a property of that name is no keyword
                  "properties": {"unevaluatedProperties": {"type": "string"}}})


def test_classes_and_anchors_are_ecma_262s() -> None:
    digits = validator_for({"pattern": r"^\d+$"})
    assert first_error(digits, "123") is None
    assert first_error(digits, "\u0663") is not None  # ARABIC-INDIC DIGIT THREE: not \d
    end = validator_for({"pattern": "^a$"})
    assert first_error(end, "a\n") is not None  # $ is the end, not before a final newline


@pytest.mark.parametrize("schema", [
    # at load, the value's own $ref was followed: a traceback naming the remote address
    {"examples": [{"$ref": "http://127.0.0.1:9/q"}], "$ref": "#/examples/0"},
    # at run time, a receipt's value made its whole join internal_error dead letters
    {"properties": {"p": {"$ref": "#/examples/0"}}, "examples": [{"$ref": "#/nope"}]},
    {"properties": {"p": {"$ref": "#/enum/0"}}, "enum": [{"type": "string"}]},
    {"properties": {"p": {"$ref": "#/required"}}, "required": ["p"]},  # a list, no schema
    # maps that name subschemas, not schemas: tracebacks in the load's probes
    {"properties": {"minimum": {"type": "number"}}, "$ref": "#/properties"},
    {"$defs": {"type": {"type": "string"}}, "$ref": "#/$defs"},
])
def test_a_ref_into_a_value_is_refused_when_the_schema_loads(schema: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"points into a value \(const, default, enum, "
                                         r"examples\) or at what is not a schema"):
        check_schema(schema)


@pytest.mark.parametrize("schema, value", [
    ({"properties": {"examples": {"type": "integer"}}, "$ref": "#/properties/examples"}, 1),
    ({"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x"}, 1),
    ({"$defs": {"yes": True}, "properties": {"p": {"$ref": "#/$defs/yes"}}}, {"p": 1}),
])
def test_a_ref_to_a_schema_named_like_a_value_keyword_still_loads(schema: dict[str, Any],
                                                                   value: Any) -> None:
    check_schema(schema)
    assert first_error(validator_for(schema), value) is None
    assert first_error(validator_for(schema), "x") == (None if value != 1 else
                                                       "'x' is not of type 'integer'")


def test_a_violation_s_detail_is_the_validator_s_message_cut_at_500_characters() -> None:
    """docs/spec.md §5: a ``schema_violation``'s detail is the validator's message, at most 500
    characters: a longer message is cut there, a short one kept whole."""
    validator = validator_for({"maxLength": 1})
    detail = first_error(validator, "x" * 600)
    assert detail is not None and len(detail) == 500 and detail.startswith("'xxx")
    assert first_error(validator, "xy") == "'xy' is too long"


def test_a_values_check_gives_the_same_answer_at_any_depth_of_its_caller() -> None:
    """A check that runs out of stack is a violation of its own; whether it does may not
    depend on how deep its caller is (a join decided in the close step, at its bundle's end,
    or in a forked helper gave different closes)."""
    validator = validator_for(stack_hungry_schema())

    def at(depth: int, value: Any) -> str | None:
        return at(depth - 1, value) if depth else first_error(validator, value)

    answers = {n: {at(depth, nested(n)) for depth in (5, 200, 400)} for n in range(20, 64, 4)}
    assert all(len(found) == 1 for found in answers.values()), answers
    assert answers[20] == {None}
    assert answers[60] == {"the schema refers to itself without end on this value"}


def test_a_check_out_of_stack_inside_a_rust_extension_is_a_violation() -> None:
    """``referencing`` keeps references in ``rpds`` maps: a ``RecursionError`` in a key's
    ``__eq__`` there comes back as pyo3's PanicException (a BaseException), which failed a
    contracts file's check in CI instead of refusing the file in one line."""
    rpds = pytest.importorskip("rpds")

    class OutOfStack:
        def __hash__(self) -> int:
            return 1

        def __eq__(self, other: object) -> bool:
            raise RecursionError("maximum recursion depth exceeded")

    class PanicsInRpds:
        def iter_errors(self, value: Any) -> Any:
            rpds.HashTrieMap({OutOfStack(): 1}).get(OutOfStack())
            return iter(())

    assert first_error(PanicsInRpds(), 0) == "the schema refers to itself without end on " \
        "this value"

    class Interrupted:
        def iter_errors(self, value: Any) -> Any:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        first_error(Interrupted(), 0)
