"""Tests of the fleet-traffic simulator and its ``fanin simulate`` CLI hook."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from fanin.contracts.parsing import parse_message
from fanin.contracts.timefmt import parse_rfc3339
from fanin.fleet.cli import add_subcommand
from fanin.fleet.simulate import (
    CATEGORIES,
    CONTRACTS_PATH,
    DEAD_LETTER_ERRORS,
    FLAGS,
    MALFORMED,
    SHOWCASE_RATES,
    SimLine,
    SimRates,
    bundled_contracts,
    simulate,
    simulate_lines,
    write_simulation,
)

EXAMPLE = Path(CONTRACTS_PATH).with_name("triage.jsonl")
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")


@pytest.fixture(scope="module")
def showcase() -> list[SimLine]:
    return list(simulate_lines(400, 11, SHOWCASE_RATES))


@pytest.fixture(scope="module")
def default_run() -> list[SimLine]:
    return list(simulate_lines(1500, 3))


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    first = list(simulate(200, 5))
    assert first == list(simulate(200, 5))
    assert first != list(simulate(200, 6))
    assert all("\n" not in line for line in first)


def test_every_category_and_flag_appears(showcase: list[SimLine]) -> None:
    seen = {item.category for item in showcase}
    assert seen == set(CATEGORIES)
    flags = {flag for item in showcase for flag in item.flags}
    assert flags == set(FLAGS)


@pytest.mark.parametrize("run", ["showcase", "default_run"])
def test_each_line_is_valid_or_intentionally_malformed(run: str,
                                                       request: pytest.FixtureRequest) -> None:
    contracts = bundled_contracts()
    for item in request.getfixturevalue(run):
        _, dead = parse_message(item.line, {}, contracts)
        if item.category in MALFORMED:
            assert dead is not None, item
            assert dead["error"] == DEAD_LETTER_ERRORS[item.category], (item, dead)
        else:
            assert dead is None, (item, dead)
            msg = json.loads(item.line)
            times = [msg["opened_at"]] + ([msg["event_time"]] if "event_time" in msg else [])
            assert all(TIME.match(t) for t in times)


def _valid(items: list[SimLine]) -> list[tuple[str, dict]]:
    """(category, message) of the valid lines; a redelivery gets its original's category."""
    first: dict[str, str] = {}
    found = []
    for item in items:
        if item.category not in MALFORMED:
            if item.category == "redelivery":
                assert item.line in first, "a redelivery repeats an earlier line exactly"
            category = first.setdefault(item.line, item.category)
            found.append((category, json.loads(item.line)))
    return found


def test_behaviours_mean_what_their_category_says(showcase: list[SimLine]) -> None:
    declared: dict[str, set[str]] = {}
    contracts = bundled_contracts()
    messages = _valid(showcase)
    for _, msg in messages:
        if msg["kind"] == "open":
            spec = contracts.get(msg.get("contract", ""))
            names = msg.get("required", spec.required if spec else [])
            declared[msg["join_id"]] = set(names) | set(msg.get("optional", (spec and
                                                                              spec.optional) or []))
    skipped: dict[str, list[str]] = defaultdict(list)
    writers: dict[tuple[str, str], set[str]] = defaultdict(set)
    for _, msg in messages:
        if msg["kind"] == "receipt":
            if msg["status"] == "skipped":
                skipped[msg["join_id"]].append(msg["branch"])
            else:
                writers[(msg["join_id"], msg.get("key", msg["branch"]))].add(msg["branch"])
    for category, msg in messages:
        if msg["kind"] != "receipt":
            continue
        branch, join = msg["branch"], msg["join_id"]
        if category == "stray":
            assert branch not in declared[join]
        elif category != "skipped":
            assert branch in declared[join]
            assert not any(branch == r or branch.startswith(r + "/") for r in skipped[join]), (
                category, msg, skipped[join])
        if category == "retry":
            assert msg["attempt"] >= 2
        if category == "key_conflict":
            assert len(writers[(join, msg["key"])]) == 2
        if category == "schema_violation":
            assert msg["key"] in ("score", "verdict")


def test_joins_overlap_and_start_at_the_fixed_epoch(default_run: list[SimLine]) -> None:
    opens = sorted(parse_rfc3339(m["opened_at"]) for c, m in _valid(default_run)
                   if m["kind"] == "open" and c == "open")
    assert opens[0] == parse_rfc3339("2026-01-01T00:00:00.000Z")
    assert opens[1] - opens[0] == 100
    receipts = [m for _, m in _valid(default_run) if m["kind"] == "receipt"]
    # join i+1 opens 100 ms after join i: a receipt later than that overlaps the next join
    overlapping = [m for m in receipts
                   if parse_rfc3339(m["event_time"]) > parse_rfc3339(m["opened_at"]) + 100]
    assert len(overlapping) > 0.9 * len(receipts)


def test_summary_counts_add_up(tmp_path: Path) -> None:
    out = tmp_path / "sim.jsonl"
    summary = write_simulation(out, 300, 2, SHOWCASE_RATES)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert summary.lines == len(lines) == sum(summary.categories.values())
    assert lines == list(simulate(300, 2, SHOWCASE_RATES))
    flags = {name: 0 for name in FLAGS}
    for item in simulate_lines(300, 2, SHOWCASE_RATES):
        for flag in item.flags:
            flags[flag] += 1
    assert summary.flags == flags


def test_bundled_example_is_the_simulator_output(tmp_path: Path) -> None:
    write_simulation(tmp_path / "again.jsonl", 40, 7, SHOWCASE_RATES)
    assert (tmp_path / "again.jsonl").read_bytes() == EXAMPLE.read_bytes()
    items = list(simulate_lines(40, 7, SHOWCASE_RATES))
    assert {i.category for i in items} == set(CATEGORIES)
    assert {f for i in items for f in i.flags} == set(FLAGS)
    named = {json.loads(i.line).get("contract") for i in items if i.category == "open"}
    assert named >= set(bundled_contracts())


def test_rates_are_honoured_and_validated() -> None:
    quiet = SimRates(**{name: 0.0 for name in ("redelivery", "invalid_json", "bad_type",
                                                "missing_field", "not_object",
                                                "unknown_contract", "stray")})
    seen = {item.category for item in simulate_lines(300, 1, quiet)}
    assert seen.isdisjoint({"redelivery", "stray", *MALFORMED})
    with pytest.raises(ValueError, match="retry"):
        SimRates(retry=1.5)
    with pytest.raises(ValueError, match="joins"):
        list(simulate(-1, 0))
    assert dataclasses.replace(SimRates(), wide=1.0).wide == 1.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fanin")
    add_subcommand(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_writes_file_and_prints_one_line(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.jsonl"
    args = _parser().parse_args(["simulate", "--joins", "20", "--out", str(out), "--seed", "4",
                                 "--key-conflict", "0.5"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and "20 joins" in printed[0]
    assert out.read_text().splitlines() == list(simulate(20, 4, SimRates(key_conflict=0.5)))


@pytest.mark.parametrize("argv", [["--joins", "-1"], ["--joins", "3", "--retry", "1.5"],
                                  ["--joins", "3", "--skip", "nan"]])
def test_cli_rejects_bad_values_with_exit_2(argv: list[str],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["simulate", "--out", "x.jsonl", *argv])
    assert exited.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1
