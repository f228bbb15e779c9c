"""``fanin query --format csv`` writes RFC 4180 records every reader splits as written: a lone
carriage return in a value was left unquoted (Python's ``csv`` quotes only what its line
terminator holds), so readers split that row in two."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fanin.analysis.query import _csv_line
from fanin.cli import main

_CELLS = st.text(alphabet=st.sampled_from('ab ,"\r\n\t\u00e9'), max_size=6)


@given(st.integers(1, 4).flatmap(
    lambda width: st.lists(st.lists(_CELLS, min_size=width, max_size=width), max_size=5)))
def test_a_reader_gets_back_every_cell(rows: list[list[str]]) -> None:
    text = "".join(_csv_line(row) for row in rows)
    assert list(csv.reader(io.StringIO(text, newline=""))) == rows
    if "\r" not in text:  # what Python's writer wrote is unchanged
        expected = io.StringIO()
        csv.writer(expected, lineterminator="\n").writerows(rows)
        assert text == expected.getvalue()


def test_a_join_id_with_a_carriage_return_is_one_row(tmp_path: Path) -> None:
    messages = tmp_path / "in.jsonl"
    messages.write_text(json.dumps({"kind": "open", "join_id": "a\rb", "required": [],
                                    "opened_at": "2026-01-01T00:00:00Z"}) + "\n")
    out, result = tmp_path / "out", tmp_path / "r.csv"
    assert main(["run", "--input", str(messages), "--output", str(out)]) == 0
    assert main(["query", str(out), "select join_id, reason from closes", "--format", "csv",
                 "--out", str(result)]) == 0
    with result.open(newline="", encoding="utf-8") as handle:
        assert list(csv.reader(handle)) == [["join_id", "reason"], ["a\rb", "complete"]]
