"""docs/spec.md §1: message validation, dead-letter errors, times, JSON equality; docs/spec.md §6
loader."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from fanin.contracts import records as R
from fanin.contracts.catalog import Catalog, ContractsError, load_contracts, parse_contracts
from fanin.contracts.jsonvalue import canonical
from fanin.contracts.parsing import parse_message
from fanin.contracts.timefmt import format_ms, parse_rfc3339

SRC = {"kind": "file", "file": "in.jsonl", "line": 3}
OK = {"join_id": "j", "branch": "b", "status": "ok", "event_time": "2026-01-01T00:00:00Z"}


def error_of(data: bytes | str, contracts: tuple[str, ...] = ("triage",),
             max_bytes: int = 256 * 1024) -> tuple[str, str] | None:
    record, dead = parse_message(data, SRC, contracts, max_bytes)
    if dead is None:
        assert record is not None
        return None
    assert dead["source"] == SRC and record is None
    return dead["error"], dead["detail"]


def with_fields(**fields: object) -> str:
    return json.dumps({**OK, **fields})



def test_a_join_id_is_measured_in_code_points() -> None:
    """docs/spec.md §1: at most 256 characters: 256 emoji (1,024 UTF-8 bytes) are one."""
    assert error_of(with_fields(join_id="\U0001F600" * 256)) is None
    assert error_of(with_fields(join_id="é" * 256)) is None

@pytest.mark.parametrize(("data", "error"), [
    (b"\xff\xfe{}", "not_utf8"),
    ("not json", "invalid_json"),
    ('{"join_id": "j", "join_id": "k"}', "invalid_json"),
    ('{"join_id": NaN}', "invalid_json"),
    ('{"v": Infinity}', "invalid_json"),
    ('{"v": 1e400}', "invalid_json"),
    ('{"v": "\\ud800"}', "invalid_json"),
    ("[" * 200 + "]" * 200, "invalid_json"),
    ("[1, 2]", "not_object"),
    ('"text"', "not_object"),
    (with_fields(status="done"), "invalid_message"),
    (with_fields(attempt=0), "invalid_message"),
    (with_fields(attempt=True), "invalid_message"),
    (with_fields(attempt=1.5), "invalid_message"),
    (with_fields(key=1), "invalid_message"),
    (with_fields(branch=""), "invalid_message"),
    (with_fields(join_id="x" * 257), "invalid_message"),
    (with_fields(join_id="\U0001F600" * 257), "invalid_message"),  # code points, not bytes
    (with_fields(event_time="2026-01-01T00:00:00"), "invalid_message"),
    (with_fields(event_time="2026-02-30T00:00:00Z"), "invalid_message"),
    (with_fields(event_time="0001-01-01T00:00:00+01:00"), "invalid_message"),
    (with_fields(kind="close"), "invalid_message"),
    (with_fields(contract="nope"), "unknown_contract"),
    (json.dumps({"kind": "open", "join_id": "j", "opened_at": "2026-01-01T00:00:00Z",
                 "allow_partial": "false"}), "invalid_message"),
    (json.dumps({"kind": "open", "join_id": "j", "opened_at": "2026-01-01T00:00:00Z",
                 "deadline_s": 0}), "invalid_message"),
    (json.dumps({"kind": "open", "join_id": "j", "opened_at": "2026-01-01T00:00:00Z",
                 "required": ["a"], "optional": ["a"]}), "invalid_message"),
])
def test_bad_messages_become_dead_letters(data: bytes | str, error: str) -> None:
    found = error_of(data)
    assert found is not None and found[0] == error and found[1]


@pytest.mark.parametrize(("data", "dead"), [
    ("[1]", ("not_object", "a JSON array, not an object")),
    ('"x"', ("not_object", "a JSON string, not an object")),
    ("null", ("not_object", "a JSON null, not an object")),
    ("3.5", ("not_object", "a JSON number, not an object")),
    ("true", ("not_object", "a JSON boolean, not an object")),
    ('{"join_id":"j","value":' + "9" * 4301 + "}",
     ("invalid_json", "an integer of more than 4300 digits")),
])
def test_dead_letter_details_speak_json(data: str, dead: tuple[str, str]) -> None:
    """The details name JSON's types and limits, not Python's (NoneType, list; 'use
    sys.set_int_max_str_digits()')."""
    assert error_of(data) == dead


def test_an_integer_deadline_beyond_double_range_is_capped_like_1e300() -> None:
    def deadline(value: str) -> Any:
        text = ('{"kind":"open","join_id":"k","opened_at":"2026-01-01T00:00:00Z",'
                '"required":["a"],"deadline_s":' + value + "}")
        record, dead = parse_message(text, SRC, ("triage",), 1 << 20)
        return dead["detail"] if record is None else record[R.O_DEADLINE_MS]

    assert deadline("9" * 401) == deadline("1e300") == deadline("1e15")  # was "a valid number"
    assert deadline("-" + "9" * 401) == "field deadline_s: Input should be greater than 0"
    # zero however written is not > 0 (docs/spec.md §2: 1e-400 reads as 0); 0.0005 is 0 ms
    for zero in ("0", "0.0", "-0.0", "0e5", "1e-400"):
        assert deadline(zero) == "field deadline_s: Input should be greater than 0", zero
    assert deadline("0.0005") == 0 and deadline("1.001") == 1_001


@pytest.mark.parametrize("field", ["deadline_s", "retention_s"])
def test_a_contracts_integer_beyond_double_range_is_capped_as_an_opens_is(field: str) -> None:
    """docs/spec.md §2, §6: seconds beyond any timestamp are capped, however written (a
    contract refused 10**309 as "a valid number" where an open took it)."""
    def loaded(value: str) -> Any:
        text = f"contracts:\n  - name: x\n    required: [a]\n    {field}: {value}\n"
        return getattr(parse_contracts(text)["x"], field)

    assert loaded("1" + "0" * 309) == loaded("9" * 401) == sys.float_info.max
    with pytest.raises(ContractsError, match=f"field {field}: Input should be greater than"):
        loaded("-1" + "0" * 309)


def test_every_bad_field_is_named_once() -> None:
    found = error_of(with_fields(status="done", attempt="2"))
    assert found is not None
    assert found[1].count("field status") == 1 and found[1].count("field attempt") == 1


def test_size_limit_counts_bytes() -> None:
    line = json.dumps({**OK, "value": "é" * 600}, ensure_ascii=False)  # ~1300 bytes, 700 chars
    assert error_of(line, max_bytes=1000) == ("too_large", "1298 bytes > limit 1000")
    assert error_of(line, max_bytes=2000) is None
    assert error_of(line.encode(), max_bytes=1000)[0] == "too_large"  # type: ignore[index]


def test_non_utf8_keeps_the_exact_bytes() -> None:
    _, dead = parse_message(b"\xffabc", SRC, ())
    assert dead is not None and dead["raw_base64"] == "/2FiYw=="


def test_valid_receipt_defaults_and_ignored_fields() -> None:
    record, dead = parse_message(json.dumps({**OK, "extra": {"x": 1}, "required": "ignored",
                                             "error": None}), SRC, ())
    assert dead is None and record is not None
    assert record[R.R_KEY] == "b" and record[R.R_ATTEMPT] == 1 and record[R.R_VALUE] is None
    assert json.loads(record[R.RAW])["extra"] == {"x": 1}


def test_times_truncate_to_milliseconds_and_honour_offsets() -> None:
    assert parse_rfc3339("2026-01-01T01:00:00.123999+01:00") == \
        parse_rfc3339("2026-01-01T00:00:00.123Z")
    assert format_ms(parse_rfc3339("2026-01-01t00:00:00.5z")) == "2026-01-01T00:00:00.500Z"
    assert format_ms(parse_rfc3339("9999-12-31T23:59:59.999Z")) == "9999-12-31T23:59:59.999Z"
    assert parse_rfc3339("2016-12-31T23:59:60Z") == parse_rfc3339("2016-12-31T23:59:59.999Z")
    for bad in ("2026-01-01 00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01T00:00:00+24:00",
                "2026-13-01T00:00:00Z", "10000-01-01T00:00:00Z", "2025-02-29T00:00:00Z"):
        with pytest.raises(ValueError):
            parse_rfc3339(bad)


@pytest.mark.parametrize("text", ["0000-12-31T23:30:00-01:00", "9999-12-31T23:30:00-01:00",
                                  "0001-01-01T00:30:00+01:00"])
def test_a_year_outside_0001_9999_as_written_or_in_utc_is_refused(text: str) -> None:
    """docs/spec.md §1: years 0001-9999 as written and as UTC instants."""
    with pytest.raises(ValueError):
        parse_rfc3339(text)
    assert parse_rfc3339("0001-01-01T00:30:00+00:30") == parse_rfc3339("0001-01-01T00:00:00Z")


def test_json_equality() -> None:
    assert canonical(1) == canonical(1.0) and canonical(10**20) == canonical(1e20)
    assert canonical(True) != canonical(1)
    assert canonical({"a": 1, "b": [1, 2]}) == canonical({"b": [1.0, 2], "a": 1})
    assert canonical([1, 2]) != canonical([2, 1])
    assert canonical(10**20 + 1) != canonical(1e20)


def test_contracts_file_errors_name_file_contract_and_field(tmp_path: object) -> None:
    cases = {
        "contracts:\n  - name: a\n    deadline_s: -1\n": "contract 'a': field deadline_s",
        # zero is not > 0 (joins would time out the moment they open)
        "contracts:\n  - name: a\n    deadline_s: 0\n":
            "contract 'a': field deadline_s: Input should be greater than 0",
        "contracts:\n  - name: a\n    required: [x]\n    optional: [x]\n":
            "c.yaml: contract 'a': branches both required and optional: ['x']",
        # a field the file format does not have is refused, not ignored
        "contracts:\n  - name: a\ndefaults:\n  deadline_s: 5\n":
            "unknown top-level field(s) ['defaults']",
        # a $ref cycle reached only on an array (docs/spec.md §6 probes [] and {} too)
        "contracts:\n  - name: a\n    schemas: {k: {if: {type: array}, then: {$ref: '#'}}}\n":
            "refers to itself without end",
        "contracts:\n  - name: a\n    allow_partial: 'yes'\n": "field allow_partial",
        "contracts:\n  - name: a\n    colse_trigger: eager\n": "field colse_trigger",
        "contracts:\n  - name: a\n  - name: a\n": "duplicate contract name",
        "contracts:\n  - name: a\n    schemas: {k: {type: 12}}\n": "field schemas",
        "contracts:\n  - required: [x]\n": "contract #1: field name",
        "contracts: {}\n": "top-level 'contracts:' list",
        "contracts: [\n": "not valid YAML",
        "contracts:\n  - !!python/object/apply:os.system [echo hi]\n": "not valid YAML",
        # YAML keeps the last of a repeated key silently: contract 'a' would vanish
        "contracts:\n  - name: a\n    name: b\n": "not valid YAML: repeated key 'name' (line 3)",
        "contracts: []\ncontracts:\n  - name: a\n": "repeated key 'contracts' (line 2)",
        "contracts:\n  - name: a\n    schemas: {k: {type: integer}, k: {}}\n": "repeated key 'k'",
        # values JSON cannot hold
        "contracts:\n  - name: a\n    schemas: {k: {maximum: .nan}}\n":
            "not JSON: contracts[0].schemas.k.maximum: nan is not a JSON number",
        "contracts:\n  - name: a\n    schemas: {k: {enum: [!!timestamp 2020-01-01]}}\n":
            "not JSON: contracts[0].schemas.k.enum[0]: a date is not a JSON value",
        # an explicit tag's value its constructor cannot read (a KeyError traceback)
        "contracts:\n  - name: a\n    schemas: {k: {const: !!bool maybe}}\n":
            "not valid YAML: cannot read 'maybe' as the value its tag names",
        # a hexadecimal integer of more than 4,300 digits (a raw Python error, later)
        "contracts:\n  - name: a\n    schemas: {k: {const: 0x" + "f" * 4000 + "}}\n":
            "not valid YAML: an integer of more than 4,300 digits",
        "contracts:\n  - name: a\n    schemas: {k: {const: !!binary aGk=}}\n":
            "a bytes is not a JSON value",
        "contracts:\n  - name: a\n    schemas: {k: {properties: {1: {}}}}\n":
            "contracts[0].schemas.k.properties: key 1 is not a string",
        # a $ref cycle that never reaches the value: every check would recurse for ever
        "contracts:\n  - name: a\n    schemas: {k: {$ref: '#'}}\n":
            "refers to itself without end (a $ref cycle)",  # it said "on None"
        # a second document: PyYAML's whole reason (its first half was dropped)
        "contracts: []\n---\n": "not valid YAML: expected a single document in the stream but "
            "found another document (line 2)",
        # YAML 1.1's booleans are strings in YAML 1.2, JSON's
        "contracts:\n  - name: a\n    allow_partial: yes\n": "field allow_partial",
        "contracts:\n  - name: a\n    schemas: {k: {$defs: {r: {$ref: '#/$defs/r'}}, "
        "$ref: '#/$defs/r'}}\n": "(a $ref cycle)",
        # a schema that is neither an object nor a boolean: it named pydantic's union member
        # ("field schemas.k.dict[str,any]: Input should be a valid dictionary")
        "contracts:\n  - name: a\n    schemas: {k: null}\n":
            "contract 'a': field schemas: schema for key 'k': a JSON Schema is an object or "
            "true/false, not null",
        "contracts:\n  - name: a\n    schemas: {k: 1}\n": "true/false, not a number",
        "contracts:\n  - name: a\n    schemas: {k: [true]}\n": "true/false, not an array",
        "contracts:\n  - name: a\n    schemas: {k: 'true'}\n": "true/false, not a string",
        # nesting beyond what can be read
        "contracts:\n  - name: a\n    schemas: {k: {const: " + "[" * 3000 + "]" * 3000 + "}}\n":
            "nested too deeply",
        # a lone surrogate is no text (docs/spec.md §1): it failed the run's close later
        '{"contracts": [{"name": "a", "required": ["b\\ud800"]}]}':
            "not JSON: contracts[0].required[0]: 'b\\ud800' holds a lone surrogate, not text",
        '{"contracts": [{"name": "a", "schemas": {"k\\udfff": {}}}]}':
            "not JSON: contracts[0].schemas: key 'k\\udfff' holds a lone surrogate, not text",
        '{"contracts": [{"name": "a", "required": ["\\ude42\\ud83d"]}]}':  # pair reversed
            "holds a lone surrogate, not text",
    }
    for text, expected in cases.items():
        with pytest.raises(ContractsError) as info:
            parse_contracts(text, origin="c.yaml")
        assert str(info.value).startswith("c.yaml: ") and expected in str(info.value)
    with pytest.raises(ContractsError, match="cannot read"):
        load_contracts(str(tmp_path) + "/missing.yaml")


def test_an_escaped_surrogate_pair_reads_as_its_character_as_json_reads_it() -> None:
    """``json.dump`` writes a character beyond the BMP as a pair of escapes; YAML's reader made
    them two lone surrogates (a contract name refused, a branch name that failed the run, an
    ``enum`` no value could match)."""
    smile = "\U0001f642"
    as_json = json.dumps({"contracts": [{"name": smile, "required": [smile, "x"],
                                         "schemas": {smile: {"enum": [smile]}}}]})
    assert "\\ud83d\\ude42" in as_json
    found = parse_contracts(as_json, origin="c.json")[smile]
    assert (found.required, found.schemas) == ([smile, "x"], {smile: {"enum": [smile]}})
    assert parse_contracts('contracts:\n  - name: "\\ud83d\\ude42"\n') == \
        parse_contracts(f"contracts:\n  - name: {smile}\n")


def test_scalars_are_yaml_1_2s_as_in_json() -> None:
    """docs/spec.md §6: the contracts file's scalars are YAML 1.2's core schema, JSON's (PyYAML
    reads YAML 1.1: ``yes`` a boolean, ``010`` eight, ``1:30`` ninety, and ``1e5`` a string,
    also in a JSON file: an enum of numbers then held strings)."""
    text = ("contracts:\n  - name: a\n    deadline_s: 010\n    schemas:\n"
            "      k: {enum: [yes, no, on, off, true, False, 1:30, 1e5, 2.5E3, 0o10, 0x1F, -.5,"
            " 2026-01-01, =]}\n")
    found = parse_contracts(text, origin="c.yaml")["a"]
    assert found.deadline_s == 10
    assert found.schemas["k"]["enum"] == ["yes", "no", "on", "off", True, False, "1:30",
                                          100000.0, 2500.0, 8, 31, -0.5, "2026-01-01", "="]
    as_json = '{"contracts": [{"name": "j", "schemas": {"k": {"enum": [1e5, 2.5E3, -1E-2]}}}]}'
    assert parse_contracts(as_json, origin="c.json")["j"].schemas["k"]["enum"] == \
        [100000.0, 2500.0, -0.01]


def test_merge_keys_and_aliases_still_load() -> None:
    """A merge key's keys may be overridden (YAML's rule): not a repeated key."""
    text = ("contracts:\n  - &one {name: a, deadline_s: 5, required: [x]}\n"
            "  - <<: *one\n    name: b\n")
    found = parse_contracts(text, origin="c.yaml")
    assert sorted(found) == ["a", "b"] and found["b"].deadline_s == 5


def test_a_schema_recursing_on_some_values_is_a_violation_not_a_failure() -> None:
    """A cycle reached only through a value of one type passes the load's probes; checking
    such a value reports a violation instead of raising."""
    from fanin.contracts.schemas import first_error, validator_for

    schema = {"if": {"type": "string", "minLength": 3}, "then": {"$ref": "#"}}
    validator = validator_for(schema)
    assert first_error(validator, 1) is None and first_error(validator, "ab") is None
    assert "refers to itself without end" in (first_error(validator, "abc") or "")


def test_fast_and_general_time_paths_agree() -> None:
    import random

    from fanin.contracts import timefmt

    rnd = random.Random(5)
    for _ in range(3000):
        ms = rnd.randrange(timefmt.MIN_MS, timefmt.MAX_MS)
        for text in (timefmt.format_ms(ms), timefmt.format_ms(ms)[:19] + "Z"):
            general = timefmt._RFC3339.match(text)
            assert general is not None and timefmt._utc_fast(text) is not None
            assert timefmt.parse_rfc3339(text) == timefmt.parse_rfc3339(text.replace("Z", "+00:00"))
    for bad in ("2026-02-30T00:00:00Z", "2026-01-01T00:00:60Z", "2026-01-01T24:00:00.000Z",
                "+026-01-01T00:00:00Z", "2026-01-01T0 :00:00Z", "0000-01-01T00:00:00Z",
                # a second already cached, with a fraction or an ending the fast path refuses
                "2026-01-01T00:00:00.\u0663\u0663\u0663Z", "2026-01-01T00:00:00.12 Z",
                "2026-01-01T00:00:00,123Z", "2026-01-01T00:00:00.123+", "2026-01-01T00:00:00+"):
        assert timefmt._utc_fast("2026-01-01T00:00:00.001Z") == 1_767_225_600_001
        assert timefmt._utc_fast(bad) is None
    assert parse_rfc3339("2016-12-31T23:59:60Z") == parse_rfc3339("2016-12-31T23:59:59.999Z")


def test_the_receipt_fast_path_matches_pydantic_on_valid_receipts() -> None:
    from fanin.contracts import parsing
    from fanin.contracts.messages import ReceiptMessage

    samples = [OK, {**OK, "key": "k", "value": {"a": [1, 2.5]}, "attempt": 3, "run_id": "r",
                    "message_id": "m", "contract": "triage", "error": None,
                    "opened_at": "2025-12-31T23:59:59.5+01:00", "extra": 1},
               {**OK, "status": "skipped", "event_time": "2026-01-01T00:00:00.123456Z"},
               {**OK, "join_id": "é" * 256}]
    for obj in samples:
        text = json.dumps(obj)
        fast = parsing._fast_receipt(obj, text, SRC)
        assert fast is not None
        assert fast == parsing._receipt_record(ReceiptMessage.model_validate(obj), text, SRC)
    for bad in ({**OK, "attempt": True}, {**OK, "join_id": "é" * 257}, {**OK, "key": 1},
                {**OK, "status": ["ok"]}, {**OK, "event_time": "2026-01-01"},
                {**OK, "contract": ""}, {**OK, "branch": ""}):
        assert parsing._fast_receipt(bad, json.dumps(bad), SRC) is None


def test_null_kind_is_a_receipt_and_an_empty_kind_is_refused() -> None:
    fields = '"join_id":"j","branch":"a","status":"ok","event_time":"2026-01-01T00:00:00Z"'
    rec, dead = parse_message('{"kind":null,' + fields + "}", ("f", 1), {})
    assert dead is None and rec is not None and rec[R.KIND] == R.RECEIPT
    _, dead = parse_message('{"kind":"",' + fields + "}", ("f", 1), {})
    assert dead is not None and dead["error"] == "invalid_message"


def test_a_null_kind_is_not_named_among_a_bad_receipts_fields() -> None:
    """A receipt the fast path refuses goes to the model, where a null kind is absent too."""
    fields = '"join_id":"j","branch":"b","status":"ok","event_time":"2026-01-01T00:00:00Z",' \
        '"attempt":0'
    for kind in ('"kind":null,', '"\\u006bind" : null ,', ""):
        _, dead = parse_message("{" + kind + fields + "}", ("f", 1), {})
        assert dead is not None and dead["detail"] == \
            "field attempt: Input should be greater than or equal to 1", kind



def test_an_open_names_its_overlapping_branches_with_its_other_bad_fields() -> None:
    """docs/spec.md §1, §5: every bad field named once, the overlap too (it was hidden by any
    other bad field); an invalid list is named alone."""
    head = '{"kind":"open","join_id":"j","opened_at":"2026-01-01T00:00:00Z",'

    def detail(fields: str) -> str:
        _, dead = parse_message(head + fields + "}", ("f", 1), {})
        assert dead is not None and dead["error"] == "invalid_message"
        return str(dead["detail"])

    overlap = '"required":["a","c"],"optional":["b","c","a"]'
    assert detail(overlap) == "branches both required and optional: ['a', 'c']"
    assert detail(overlap + ',"deadline_s":0') == "field deadline_s: Input should be " \
        "greater than 0; branches both required and optional: ['a', 'c']"
    assert detail('"required":["a",1],"optional":["a"]') == \
        "field required.1: Input should be a valid string"


@pytest.mark.parametrize(("text", "ms"), [
    ("1.001", 1001), ("1.003", 1003), ("1.005", 1005), ("2.002", 2002), ("2.006", 2006),
    ("4.35", 4350), ("1.0015", 1001), ("0.0005", 0), ("1e-300", 0), ("10", 10_000),
    ("10.0", 10_000), ("1e3", 1_000_000), ("0.1", 100), ("1e300", 10**18),
])
def test_durations_count_the_milliseconds_of_the_number_as_written(text: str, ms: int) -> None:
    """docs/spec.md §2: ``deadline_s`` (and ``retention_s``) in whole milliseconds, truncated,
    of the decimal written: ``1.001 * 1000`` in doubles is 1000.9999999999999, which made a
    deadline of 1.001 s end at 1,000 ms, and a receipt at 1,001 ms late."""
    line = '{"kind": "open", "join_id": "j", "opened_at": "2026-01-01T00:00:00Z", ' \
        f'"deadline_s": {text}}}'
    record, dead = parse_message(line, SRC, ("triage",))
    assert dead is None and record is not None
    assert record[R.O_DEADLINE_MS] == ms
    if "e" in text:
        return  # YAML 1.1 (the contracts file) reads 1e3 as a string
    catalog = parse_contracts(f"contracts:\n  - name: c\n    required: [a]\n"
                              f"    deadline_s: {text}\n    retention_s: {text}\n")
    definition = Catalog(catalog).definition("c", None, None, None, None, None)
    assert (definition.deadline_ms, definition.retention_ms) == (ms, ms)


@pytest.mark.parametrize(("data", "detail"), [
    (b"", "an empty message"),  # a Pub/Sub message with attributes and no data
    (b" \t", "only white space"),
    ("\u00a0\x1c".encode(), "Expecting value: line 1 column 1 (char 0)"),  # not JSON's
    ('\ufeff{"kind":"open"}'.encode(), "starts with a byte order mark (U+FEFF), which is not "
                                       "JSON: Expecting value: line 1 column 1 (char 0)"),
])
def test_an_empty_message_and_a_byte_order_mark_are_named(data: bytes, detail: str) -> None:
    """Both read "Expecting value: line 1 column 1 (char 0)", which says neither."""
    record, dead = parse_message(data, {"kind": "pubsub"}, frozenset({"triage"}))
    assert record is None and dead is not None
    assert (dead["error"], dead["detail"]) == ("invalid_json", detail)
