"""``encode_line``: one spelling of every output line; ``log_close``: what a close's log
event counts."""

from __future__ import annotations

import json
import logging

import orjson
import pytest
from support.builders import make_catalog, open_msg, receipt, records

from fanin.core.bounded import bounded_outputs
from fanin.core.outcomes import CLOSES, encode_line, log_close


def test_a_line_holding_an_integer_beyond_64_bits_spells_its_doubles_as_any_other_line() -> None:
    """The standard encoder, used for such a line, wrote ``1e-07`` where every other line
    has ``1e-7``: one double, two spellings in one output."""
    doubles = [1e-7, 1.5e-5, 2.5e-300, 1e16, -0.0, 0.1]
    big = [2**64, -(2**63) - 1, 10**40]
    plain = encode_line({"join_id": "j", "values": {"x": doubles}})
    line = encode_line({"join_id": "j", "values": {"x": doubles, "big": big}})
    assert line == plain[:-2] + ',"big":[18446744073709551616,-9223372036854775809,' \
        + "1" + "0" * 40 + "]}}"
    assert json.loads(line)["values"] == {"x": doubles, "big": big}
    assert line.count("1e-7,") == 1 and orjson.dumps(1e-7) == b"1e-7"


def test_integers_at_the_edges_of_64_bits_are_written_as_read() -> None:
    edges = [2**64 - 1, 2**63, -(2**63), 2**64, -(2**63) - 1]
    assert json.loads(encode_line({"v": [edges, {"n": edges}]})) == {"v": [edges, {"n": edges}]}


def test_a_logged_close_counts_as_accepted_the_ok_receipts_only(
        caplog: pytest.LogCaptureFixture) -> None:
    """``accepted`` (docs/spec.md §5) counted every entry of ``branches``: skips and failed
    receipts too (a skip of b pruning b/x and b/y, with a's ``ok``, logged 2)."""
    group = records([open_msg(required=["a", "b/x", "b/y", "c"]), receipt("a", 1),
                     receipt("b", 2, status="skipped"), receipt("c", 3, status="error",
                                                                error="down")])
    [(kind, close)] = list(bounded_outputs(group, make_catalog(), 10, 2**30))
    assert kind == CLOSES and set(close["branches"]) == {"a", "b", "c"}
    caplog.set_level(logging.INFO, logger="fanin.close")
    log_close(close)
    [event] = [json.loads(r.getMessage()) for r in caplog.records if r.name == "fanin.close"]
    assert (event["accepted"], event["required"]) == (1, ["a", "b/x", "b/y", "c"])
