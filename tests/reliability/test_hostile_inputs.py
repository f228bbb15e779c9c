"""One hostile but valid message or one ordinary setting never crashes a
run. Each is a dead letter, a conflict, or one line on stderr with exit code 2."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from fanin.cli import main
from tests.reliability.runs import KINDS, accounted, messages, parquet_rows, run_cli, write_lines

HUGE = "9" * 400
CONTRACTS = """
contracts:
  - name: money
    required: [pay]
    schemas:
      amount: {multipleOf: 0.01}
      parity: {multipleOf: 2}
"""


def _open(join_id: str, **fields: Any) -> str:
    return json.dumps({"kind": "open", "join_id": join_id,
                       "opened_at": "2026-01-01T00:00:00Z", **fields})


def _receipt(join_id: str, branch: str, raw_value: str = "1", **fields: Any) -> str:
    body = json.dumps({"join_id": join_id, "branch": branch, "status": "ok",
                       "event_time": "2026-01-01T00:00:01Z", **fields})
    return body[:-1] + f',"value":{raw_value}}}'


def _one_error_line(capsys: pytest.CaptureFixture[str], prefix: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(prefix) and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("mode", [[], ["--replay"]], ids=["bounded", "replay"])
def test_multiple_of_is_exact_on_decimal_values_of_any_size(tmp_path: Path,
                                                              mode: list[str]) -> None:
    """An integer of 400 digits is a multiple of 0.01 and not of 2 (it is odd); 19.99 is a
    multiple of 0.01, 0.015 is not (float division calls 19.99 a violation)."""
    contracts = tmp_path / "contracts.yaml"
    contracts.write_text(CONTRACTS)
    values = {"big": (HUGE, "amount"), "odd": (HUGE, "parity"), "cents": ("19.99", "amount"),
              "half": ("0.015", "amount")}
    lines = [line for join_id, (value, key) in values.items()
             for line in (_open(join_id, contract="money"),
                          _receipt(join_id, "pay", value, key=key))]
    found = run_cli(lines, tmp_path, "--contracts", str(contracts), *mode)
    conflicts = {c["join_id"]: [k["kind"] for k in c["conflicts"]] for c in found["closes"]}
    assert conflicts == {"big": [], "odd": ["schema_violation"], "cents": [],
                         "half": ["schema_violation"]}
    assert accounted(found) == messages(lines)


@pytest.mark.parametrize("mode", [[], ["--replay"]], ids=["bounded", "replay"])
def test_a_value_against_a_backtracking_pattern_is_a_violation_not_a_stall(
        tmp_path: Path, mode: list[str]) -> None:
    """40 characters against ``^(a+)+$`` took Python's re about 2**40 steps: the run never
    ended. Patterns run on RE2 (docs/spec.md §6)."""
    contracts = tmp_path / "contracts.yaml"
    contracts.write_text("contracts:\n  - name: c\n    required: [a]\n    schemas:\n"
                         "      a: {type: string, pattern: '^(a+)+$'}\n")
    lines = [_open("slow", contract="c"),
             _receipt("slow", "a", json.dumps("a" * 40 + "!"), key="a"),
             _open("fine", contract="c"), _receipt("fine", "a", json.dumps("a" * 40), key="a")]
    found = run_cli(lines, tmp_path, "--contracts", str(contracts), *mode)
    reasons = {c["join_id"]: (c["reason"], [k["kind"] for k in c["conflicts"]])
               for c in found["closes"]}
    assert reasons == {"slow": ("timeout", ["schema_violation"]), "fine": ("complete", [])}
    assert accounted(found) == messages(lines)


def test_a_pattern_that_cannot_run_in_linear_time_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    contracts = tmp_path / "contracts.yaml"
    contracts.write_text("contracts:\n  - name: c\n    schemas:\n"
                         "      a: {pattern: '^(?=x)'}\n")
    traffic = write_lines(tmp_path / "in.jsonl", [_open("j", required=["a"])])
    assert main(["run", "--input", str(traffic), "--contracts", str(contracts), "--output",
                 str(tmp_path / "out")]) == 2
    line = _one_error_line(capsys, "fanin: error: ")
    assert str(contracts) in line and "cannot be checked in linear time" in line, line


@pytest.mark.parametrize("mode", [[], ["--replay"]], ids=["bounded", "replay"])
def test_a_deadline_beyond_year_9999_closes_at_the_cap(tmp_path: Path, mode: list[str]) -> None:
    """deadline_s 1e13 (default and open): D is capped at the end of year 9999, where the
    join times out; the replay's last watermark stays within Beam's timestamps (it raised
    'Watermark must strictly-monotonically advance')."""
    lines = [_open("far", required=["pay", "ship"], deadline_s=10**13),
             _receipt("far", "pay"), _open("dflt", required=["a", "b"]), _receipt("dflt", "a")]
    found = run_cli(lines, tmp_path, "--deadline-s", "1e13", *mode)
    assert sorted((c["join_id"], c["reason"], c["closed_at"]) for c in found["closes"]) == [
        ("dflt", "timeout", "9999-12-31T23:59:59.999Z"),
        ("far", "timeout", "9999-12-31T23:59:59.999Z")]
    assert accounted(found) == messages(lines)


@pytest.mark.parametrize("ref", ["#/$defs/nope", "https://example.com/schemas/amount.json",
                                 "other.json#/x"])
def test_a_contract_with_an_unresolvable_ref_is_refused_at_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        ref: str) -> None:
    def no_fetch(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"fetched {args}")

    monkeypatch.setattr(urllib.request, "urlopen", no_fetch)
    contracts = tmp_path / "contracts.yaml"
    contracts.write_text(CONTRACTS.replace("{multipleOf: 0.01}", json.dumps({"$ref": ref})))
    traffic = write_lines(tmp_path / "in.jsonl", [_open("j", contract="money")])
    code = main(["run", "--input", str(traffic), "--output", str(tmp_path / "out"),
                 "--contracts", str(contracts)])
    assert code == 2
    err = _one_error_line(capsys, "fanin: error: ")
    assert "'money'" in err and "amount" in err and ref in err
    assert not (tmp_path / "out").exists()


def test_a_local_ref_still_validates(tmp_path: Path) -> None:
    contracts = tmp_path / "contracts.yaml"
    contracts.write_text(CONTRACTS.replace(
        "{multipleOf: 0.01}", '{"$defs": {"cents": {"multipleOf": 0.01}}, '
        '"$ref": "#/$defs/cents"}'))
    lines = [_open("a", contract="money"), _receipt("a", "pay", "0.015", key="amount")]
    found = run_cli(lines, tmp_path, "--contracts", str(contracts))
    assert [c["kind"] for c in found["closes"][0]["conflicts"]] == ["schema_violation"]


def test_an_attempt_beyond_64_bits_is_a_dead_letter_and_every_tool_works(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [_open("j", required=["a"]), _receipt("j", "a", attempt=1180591620717411303424),
             _receipt("j", "a", attempt=2**63 - 1)]
    found = run_cli(lines, tmp_path, "--format", "jsonl", "--format", "parquet")
    (dead,) = found["dead_letter"]
    assert dead["error"] == "invalid_message" and "attempt" in dead["detail"]
    (close,) = found["closes"]
    assert close["branches"]["a"]["attempt"] == 2**63 - 1
    assert parquet_rows(tmp_path / "out") == {k: len(found[k]) for k in KINDS}
    out = str(tmp_path / "out")
    capsys.readouterr()
    assert main(["query", out, "select max(branches[1].attempt) as a from closes",
                 "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ["a", str(2**63 - 1)]
    assert main(["report", out]) == 0


def test_query_and_report_refuse_an_integer_beyond_64_bits_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    found = run_cli([_open("j", required=["a"]), _receipt("j", "a")], tmp_path)
    closes = found["closes"]
    closes[0]["branches"]["a"]["attempt"] = 1180591620717411303424  # a file from elsewhere
    (path,) = (tmp_path / "out" / "closes").glob("*.jsonl")
    path.write_text(json.dumps(closes[0]) + "\n")
    for argv in (["query", str(tmp_path / "out"), "select * from closes"],
                 ["report", str(tmp_path / "out")]):
        capsys.readouterr()
        assert main(argv) == 2
        assert "64-bit" in _one_error_line(capsys, f"fanin {argv[0]}: error: ")


@pytest.mark.parametrize("case", ["output_is_a_file", "closes_is_a_file_with_overwrite",
                                  "closes_is_a_file"])
def test_an_output_path_that_is_a_file_is_one_line(tmp_path: Path, case: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    traffic = write_lines(tmp_path / "in.jsonl", [_open("j", required=["a"])])
    out = tmp_path / "out"
    if case == "output_is_a_file":
        out.write_text("not a folder\n")
    else:
        out.mkdir()
        (out / "closes").write_text("not a folder\n")
    extra = ["--overwrite"] if case.endswith("overwrite") else []
    assert main(["run", "--input", str(traffic), "--output", str(out), *extra]) == 2
    assert "is a file, not a folder" in _one_error_line(capsys, "fanin: error: ")


def _denied_to_this_user(monkeypatch: pytest.MonkeyPatch, *denied: Path) -> None:
    """Permissions as an unprivileged user sees them (the suite may run as root, whom mode
    bits do not stop): ``denied`` paths cannot be opened, nor written or emptied as folders.
    The paths are also made read-only for real."""
    from apache_beam.io.filesystems import FileSystems

    names = {str(path) for path in denied}
    access, open_file = os.access, FileSystems.open

    def checked_access(path: Any, mode: int, **kwargs: Any) -> bool:
        return False if str(path) in names and mode & os.W_OK else access(path, mode, **kwargs)

    def checked_open(path: str, *args: Any, **kwargs: Any) -> Any:
        if path in names:
            raise PermissionError(13, "Permission denied", path)
        return open_file(path, *args, **kwargs)

    for path in denied:
        path.chmod(0o500 if path.is_dir() else 0)
    monkeypatch.setattr(os, "access", checked_access)
    monkeypatch.setattr(FileSystems, "open", checked_open)


@pytest.mark.parametrize("mode", [[], ["--replay"]], ids=["bounded", "replay"])
def test_an_input_this_user_cannot_read_is_one_line(
        tmp_path: Path, mode: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    readable = write_lines(tmp_path / "a.jsonl", [_open("j", required=["a"])])
    for name in ("b.jsonl", "b.jsonl.gz"):
        locked = write_lines(tmp_path / name, [_receipt("j", "a")])
        _denied_to_this_user(monkeypatch, locked)
        capsys.readouterr()
        assert main(["run", "--input", str(readable), "--input", str(locked), "--output",
                     str(tmp_path / "out"), "--overwrite", *mode]) == 2
        assert _one_error_line(capsys, "fanin: error: ") == \
            f"fanin: error: input {locked} cannot be read (Permission denied)"
        assert not (tmp_path / "out").exists()  # refused before anything was written


@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "fresh_folders"])
def test_output_folders_this_user_cannot_write_are_one_line_and_nothing_is_deleted(
        tmp_path: Path, overwrite: bool, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    traffic = write_lines(tmp_path / "in.jsonl", [_open("j", required=["a"]),
                                                  _receipt("j", "a")])
    out = tmp_path / "out"
    earlier = {}
    for kind in KINDS:  # an earlier run's files, or empty folders made beforehand
        (out / kind).mkdir(parents=True)
        if overwrite:
            earlier[kind] = write_lines(out / kind / f"{kind}-all-p0000-s000.jsonl", ["{}"])
    _denied_to_this_user(monkeypatch, out / "late")
    assert main(["run", "--input", str(traffic), "--output", str(out),
                 *(["--overwrite"] if overwrite else [])]) == 2
    reason = (f"--overwrite: cannot delete the files in {out / 'late'}" if overwrite
              else f"--output: cannot write in {out / 'late'}")
    assert _one_error_line(capsys, "fanin: error: ") == f"fanin: error: {reason}: permission denied"
    assert all(path.read_text() == "{}\n" for path in earlier.values())  # closes/ kept too


def test_a_negative_worker_count_for_beam_is_one_line(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    traffic = write_lines(tmp_path / "in.jsonl", [_open("j", required=["a"])])
    assert main(["run", "--input", str(traffic), "--output", str(tmp_path / "out"),
                 "--direct_num_workers", "-1"]) == 2
    assert _one_error_line(capsys, "fanin: error: ") == \
        "fanin: error: --direct_num_workers must be 1 or more (0: as many as the machine has cores)"


@pytest.mark.parametrize("mode", [(), ("--replay",)], ids=["bounded", "replay"])
def test_a_line_far_beyond_the_limit_is_a_dead_letter_of_its_first_bytes(
        tmp_path: Path, mode: tuple[str, ...]) -> None:
    """docs/spec.md §1: a message longer than ``--max-bytes`` is ``too_large``; one of many MB
    is never held whole: its ``raw`` is its first bytes (whole characters), its ``detail``
    its size. Its first bytes being valid JSON (a message padded with spaces) changes
    nothing."""
    padded = _receipt("j", "a")[:-1] + " " * 300 + "}"
    lines = [_open("j", required=["a"]), _receipt("j", "a"), padded, "é" * 150, "[" + "1," * 90]
    found = run_cli(lines, tmp_path, "--max-bytes", "200", *mode)
    letters = sorted((d["error"], d["detail"], d["raw"]) for d in found["dead_letter"])
    assert letters == sorted([
        ("too_large", f"{len(padded)} bytes > limit 200", padded[:206]),
        ("too_large", "300 bytes > limit 200", "é" * 103),
        ("invalid_json", letters[0][1], "[" + "1," * 90)])
    assert accounted(found) == messages(lines)
