"""What a join may cost on Dataflow workers: closes are logged only when asked (defect 5), and a
join holds at most ``max_bytes_per_join`` of messages, batch and stream alike (defect 6)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from apache_beam.coders import coders

from fanin.contracts.parsing import DEFAULT_MAX_BYTES, parse_message
from fanin.contracts.timefmt import format_ms, parse_rfc3339
from fanin.pipelines.pipeline import ConfigError, RunConfig, run_pipeline
from fanin.transforms import join, join_streaming

KINDS = ("closes", "late", "dead_letter")
T0 = parse_rfc3339("2026-01-01T00:00:00Z")
CONTRACTS = """
contracts:
  - name: big
    required: [a, b, c]
    deadline_s: 30
"""


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _receipt(branch: str, at_s: int, value: str) -> str:
    return _line({"join_id": "j1", "branch": branch, "status": "ok", "value": value,
                  "event_time": format_ms(T0 + at_s * 1000)})


def _run(tmp_path: Path, lines: list[str], replay: bool, **config: Any) -> dict[str, list]:
    data, contracts = tmp_path / "in.jsonl", tmp_path / "contracts.yaml"
    data.write_text("".join(f"{x}\n" for x in lines))
    contracts.write_text(CONTRACTS)
    out = tmp_path / ("replay" if replay else "bounded")
    run_pipeline(RunConfig(output=str(out), inputs=[str(data)], contracts_path=str(contracts),
                           replay=replay, **config), [])
    return {kind: [json.loads(x) for f in sorted((out / kind).glob("*.jsonl"))
                   for x in f.read_text().splitlines()] for kind in KINDS}


OPEN = _line({"kind": "open", "join_id": "j1", "opened_at": format_ms(T0), "contract": "big"})
A, B = _receipt("a", 1, "x" * 900), _receipt("b", 2, "y" * 900)
C = _receipt("c", 3, "z")  # small: it would fit after b, but the join is full by then
CAP = len(OPEN) + len(A) + len(B) - 1  # open and a fit; b does not


@pytest.mark.parametrize("replay", [False, True], ids=["bounded", "stream"])
def test_a_join_holds_at_most_max_bytes_per_join(tmp_path: Path, replay: bool) -> None:
    assert len(OPEN) + len(A) + len(C) <= CAP < len(OPEN) + len(A) + len(B)
    found = _run(tmp_path, [OPEN, A, B, C], replay, max_bytes=1000, max_bytes_per_join=CAP)
    (close,) = found["closes"]
    assert close["reason"] == "timeout" and close["counts"]["messages"] == 2
    assert sorted(close["branches"]) == ["a"]
    assert found["late"] == []
    dead = found["dead_letter"]
    assert [d["error"] for d in dead] == ["join_too_large"] * 2
    assert sorted(json.loads(d["raw"])["branch"] for d in dead) == ["b", "c"]
    assert "max_bytes_per_join" in dead[0]["detail"]


@pytest.mark.parametrize("replay", [False, True], ids=["bounded", "stream"])
def test_within_the_byte_cap_nothing_changes(tmp_path: Path, replay: bool) -> None:
    found = _run(tmp_path, [OPEN, A, B, C], replay, max_bytes=1000,
                 max_bytes_per_join=len(OPEN) + len(A) + len(B) + len(C))
    (close,) = found["closes"]
    assert close["reason"] == "complete" and found["dead_letter"] == found["late"] == []


def test_the_byte_cap_must_hold_one_message() -> None:
    with pytest.raises(ConfigError, match="--max-bytes-per-join must be >= --max-bytes"):
        RunConfig(output="o", inputs=["i"], max_bytes=1000, max_bytes_per_join=999).validate()


@pytest.mark.parametrize("limits", [{"max_bytes": 2**62, "max_bytes_per_join": 2**62},
                                    {"max_bytes_per_join": 2**63 - 2}])
def test_a_size_limit_beyond_any_index_is_refused(limits: dict[str, int]) -> None:
    """``fanin run --max-bytes 9223372036854775806 ...`` blamed the input file: "cannot be
    read at its start (OverflowError ...)"."""
    with pytest.raises(ConfigError, match=r"^--max-bytes and --max-bytes-per-join must be < "
                                          r"4611686018427387904 \(2\*\*62\)$"):
        RunConfig(output="o", inputs=["i"], **limits).validate()
    RunConfig(output="o", inputs=["i"], max_bytes=2**62 - 1,
              max_bytes_per_join=2**62 - 1).validate()


def test_the_default_cap_keeps_a_join_under_dataflows_limits() -> None:
    """A record in state takes ~4x its message (measured here with Beam's coder on a message of
    the largest size accepted); a full join's bag plus its close must fit one key commit
    (~180 MB) and its close one element (~80 MB), with room to spare."""
    value = "v" * (DEFAULT_MAX_BYTES - 200)
    message = _line({"join_id": "j1", "branch": "a", "status": "ok", "value": value,
                     "event_time": format_ms(T0)})
    record, dead = parse_message(message, {"kind": "test"}, frozenset(), DEFAULT_MAX_BYTES)
    assert dead is None, dead
    ratio = len(coders.FastPrimitivesCoder().encode(record)) / len(message.encode())
    cap = join.DEFAULT_MAX_BYTES_PER_JOIN
    assert 3 < ratio < 4.5
    assert cap * ratio + cap < 0.5 * 180e6 and cap < 0.25 * 80e6
    assert RunConfig(output="o").max_bytes_per_join == cap


def test_meta_written_by_an_earlier_fanin_reads_with_defaults() -> None:
    """After ``--update`` from a Fanin whose META had fewer slots (5: before FULL; 6: before
    BYTES), the missing slots read as their defaults instead of failing every arrival."""
    for old in ([1, 2, 3, None, None], [1, 2, 3, None, None, None]):
        value = join_streaming._read_meta(SimpleNamespace(read=lambda old=old: list(old)))
        assert value == [1, 2, 3, None, None, None, 0]
    current = [1, 2, 3, 4, None, None, 77]
    assert join_streaming._read_meta(SimpleNamespace(read=lambda: list(current))) == current
    assert join_streaming._read_meta(SimpleNamespace(read=lambda: None)) is None


@pytest.mark.parametrize("replay", [False, True], ids=["bounded", "stream"])
@pytest.mark.parametrize("log_closes", [False, True])
def test_closes_are_logged_on_workers_only_when_asked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, replay: bool, log_closes: bool
        ) -> None:
    """A Beam worker logs at INFO (sdk_worker_main: ``--default_sdk_harness_log_level``
    defaults to INFO) and never runs ``fanin run``'s own logger set-up: without
    ``--log-closes`` no close may be logged there."""
    caplog.set_level(logging.INFO)  # the worker's root level
    caplog.set_level(logging.NOTSET, logger="fanin.close")  # untouched on a worker
    found = _run(tmp_path, [OPEN, A, B, C], replay, log_closes=log_closes)
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "fanin.close"]
    assert len(found["closes"]) == 1
    if log_closes:
        assert [(e["event"], e["join_id"]) for e in logged] == [("join_closed", "j1")]
    else:
        assert logged == []
