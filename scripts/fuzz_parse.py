"""Coverage-guided fuzzing of ``fanin.contracts.parsing.parse_message`` with atheris.

Each input is fed as bytes (the pipeline's entry point) and, when it is UTF-8, also as text.
The harness raises (and libFuzzer saves a ``crash-*`` file) when ``parse_message`` raises or
breaks its contract: exactly one of ``(record, None)`` / ``(None, dead_letter)``; a dead letter
with a known ``error``, a one-line non-empty ``detail``, ``raw`` equal to the input text (or
``raw_base64`` of the exact bytes) and the given ``source``, writable as UTF-8; a record whose
``RAW`` is the input and re-parses to the same record. Half of the inputs are also checked
with a small ``max_bytes`` so that the size limit is exercised.

Always bound a run::

    .venv/bin/pip install atheris
    mkdir -p /tmp/fanin-fuzz
    .venv/bin/python scripts/fuzz_parse.py -max_total_time=180 -max_len=4096 \\
        /tmp/fanin-fuzz tests/data/fuzz_corpus          # or -runs=100000

libFuzzer writes new interesting inputs into the first folder (keep the committed corpus
second so it is only read). Interesting finds are copied by hand into
``tests/data/fuzz_corpus/<expected>--<label>.bin``, which
``tests/contracts/test_fuzz_parse.py`` replays.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import atheris

with atheris.instrument_imports(include=["fanin"]):
    from fanin.contracts import records as R
    from fanin.contracts.parsing import DEFAULT_MAX_BYTES, ERRORS, parse_message

CONTRACTS = frozenset({"triage", "review"})


def check(data: bytes | str, max_bytes: int) -> None:
    """Raise ``AssertionError`` if ``parse_message`` breaks its contract on ``data``."""
    source: dict[str, Any] = {"kind": "file", "file": "fuzz", "line": 1}
    record, dead = parse_message(data, source, CONTRACTS, max_bytes)
    assert (record is None) != (dead is None)
    if isinstance(data, bytes):
        try:
            text: str | None = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    else:
        text = data
    if dead is not None:
        assert dead["error"] in ERRORS, dead
        assert dead["detail"].strip() and "\n" not in dead["detail"], dead
        assert dead["source"] is source
        if text is None:
            assert base64.b64decode(dead["raw_base64"]) == data
        else:
            assert dead["raw"] == text and "raw_base64" not in dead
        json.dumps(dead, ensure_ascii=False).encode("utf-8")
        return
    assert text is not None and record[R.RAW] == text and record[R.SOURCE] is source
    again, none = parse_message(text, source, CONTRACTS, max_bytes)
    assert none is None and again == record
    assert isinstance(json.loads(text), dict)
    text.encode("utf-8")


def test_one_input(data: bytes) -> None:
    """libFuzzer entry point."""
    limit = DEFAULT_MAX_BYTES if not data or data[0] & 1 else 64
    check(data, limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    check(text, limit)


def main() -> None:
    """Parse libFuzzer options from ``sys.argv`` and fuzz."""
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
