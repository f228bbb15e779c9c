"""``read_join_id``, the bounded plan's key before the shuffle: whenever it names a join_id and
``parse_message`` returns a record for the same message, the record's join_id is that one; what
it cannot tell (None) is left to the full parse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fanin.contracts import records as R
from fanin.contracts.lines import LongLine
from fanin.contracts.parsing import parse_message, read_join_id

CORPUS = Path(__file__).resolve().parents[1] / "data" / "fuzz_corpus"
SOURCE = ("in.jsonl", 1)

_ids = st.text(alphabet=st.characters(codec="utf-8"), min_size=0, max_size=6) | st.sampled_from(
    ["j", "x" * 256, "x" * 257, "\u2028", 'a"b', "é"])
_receipt = st.fixed_dictionaries(
    {"join_id": _ids | st.integers() | st.none(), "branch": st.just("a"),
     "status": st.just("ok"), "event_time": st.just("2026-01-01T00:00:00Z")})


def _agree(data: bytes | str) -> None:
    key = read_join_id(data)
    record, dead = parse_message(data, SOURCE, frozenset())
    if key is not None and record is not None:
        assert record[R.JOIN_ID] == key, data
    if key is None and record is not None:  # the full parse keys it: nothing is lost
        assert isinstance(record[R.JOIN_ID], str)
    assert (record is None) != (dead is None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_receipt, st.booleans(), st.sampled_from(["", "join_id", "branch"]))
def test_the_key_is_the_records_join_id(message: dict[str, Any], ascii_only: bool,
                                        repeated: str) -> None:
    text = json.dumps(message, ensure_ascii=ascii_only)
    if repeated:  # a field name twice: orjson keeps the last, the strict decoder refuses
        text = text[:-1] + f', "{repeated}": "other"}}'
    _agree(text)
    _agree(text.encode("utf-8"))


def test_a_repeated_join_id_is_keyed_but_never_becomes_a_record() -> None:
    text = '{"join_id": "a", "join_id": "b", "branch": "x", "status": "ok", ' \
           '"event_time": "2026-01-01T00:00:00Z"}'
    assert read_join_id(text) == "b"
    record, dead = parse_message(text, SOURCE, frozenset())
    assert record is None and dead is not None and dead["error"] == "invalid_json"


def test_what_it_cannot_tell_is_none() -> None:
    assert read_join_id(b"{not json") is None
    assert read_join_id(b"[1]") is None
    assert read_join_id(b'{"join_id": 7}') is None
    assert read_join_id(b'{"join_id": ""}') is None
    assert read_join_id('{"join_id": "' + "x" * 257 + '"}') is None
    assert read_join_id('{"join_id": "\ud800"}'.encode("utf-8", "surrogatepass")) is None
    big = b'{"join_id": "j", "pad": "' + b"x" * 300 + b'"}'
    assert read_join_id(big, max_bytes=100) is None and read_join_id(big) == "j"


def test_the_fuzz_corpus_is_keyed_as_it_parses() -> None:
    files = sorted(CORPUS.glob("*.bin"))
    assert files
    for path in files:
        _agree(path.read_bytes())


def test_a_long_lines_first_bytes_are_too_large_whatever_they_are() -> None:
    """A ``LongLine`` (the first bytes of a line longer than the read's limit) that is valid
    JSON on its own (a message padded with spaces) is keyed by no one and is ``too_large``
    with the line's size."""
    first = LongLine(b'{"join_id":"j","branch":"a","status":"ok",'
                     b'"event_time":"2026-01-01T00:00:00Z"}  ', 5_000_000)
    assert read_join_id(first, max_bytes=1 << 20) is None
    record, dead = parse_message(first, SOURCE, frozenset(), 1 << 20)
    assert record is None and dead is not None
    assert (dead["error"], dead["detail"]) == ("too_large", "5000000 bytes > limit 1048576")
