"""Security properties: safe YAML, no code execution on input, read-only SQL, clean logs.

- Contracts files are read with a safe loader: Python object tags are refused with
  ``ContractsError`` and never executed.
- No input can reach ``pickle``/``eval``/``exec``/a shell: ruff's security rules (``S``) pass
  on ``fanin/``, each exception a ``noqa`` with its reason.
- ``fanin query`` cannot write or read files through SQL (``COPY ... TO``, ``ATTACH``,
  ``read_csv``, ``SET`` to undo the lock-down, several statements).
- Logs of a run with ``--log-closes`` never contain receipt values, errors or raw lines.
- Neither help texts nor logs print anything that looks like a credential, even when the
  environment holds some.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fanin.analysis.query import QueryRefused, open_outputs, run_query
from fanin.cli import main
from fanin.contracts.catalog import ContractsError, load_contracts, parse_contracts
from fanin.fleet.simulate import CONTRACTS_PATH

FANIN = Path(__file__).resolve().parents[1] / "fanin"
MARKER = "M4RK3R-9c1f-secret-receipt-value"
FAKE_KEY = "AKIAFANINTESTKEY0001"
FAKE_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYFANINSECRET"
KEY_LIKE = re.compile(
    r"AKIA[0-9A-Z]{16}|-----BEGIN [A-Z ]*PRIVATE KEY-----|AIza[0-9A-Za-z_\-]{35}|"
    r"gh[pousr]_[0-9A-Za-z]{36}|xox[baprs]-[0-9A-Za-z-]{10,}|\"private_key\"\s*:|"
    r"(?i:(?:password|passwd|secret|token|api[_-]?key)\s*[=:]\s*\S{8,})")


# ----------------------------------------------------------------------------- YAML
@pytest.mark.parametrize("tag", [
    "!!python/object/apply:os.system ['touch {canary}']",
    "!!python/object/new:os.system ['touch {canary}']",
    "!!python/name:os.system",
    "!!python/object:fanin.contracts.catalog.Contract {{name: x}}",
])
def test_contracts_file_refuses_python_tags(tmp_path: Path, tag: str) -> None:
    canary = tmp_path / "executed"
    text = f"contracts:\n  - name: x\n    required: [a]\n    schemas: {tag.format(canary=canary)}\n"
    path = tmp_path / "evil.yaml"
    path.write_text(text)
    with pytest.raises(ContractsError) as info:
        load_contracts(str(path))
    assert str(path) in str(info.value)
    with pytest.raises(ContractsError):
        parse_contracts(f"contracts: {tag.format(canary=canary)}\n")
    assert not canary.exists()


def test_contracts_file_with_plain_yaml_still_loads() -> None:
    assert "triage" in load_contracts(CONTRACTS_PATH)  # the refusals above are not blanket


def _alias_bomb(levels: int, where: str) -> str:
    """A few hundred bytes that YAML's aliases expand to 10**levels strings (``where``: the
    schema keyword that holds the last alias)."""
    lines = ["contracts:", "  - name: x", "    required: [a]", "    schemas:",
             "      a:", "        examples:", '          - &l0 ["lol"]']
    lines += [f"          - &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]"
              for i in range(1, levels + 1)]
    lines.append(f"        {where}: *l{levels}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["enum", "required"])  # a valid schema, and an invalid one
def test_contracts_file_of_nested_aliases_is_refused_in_one_line(where: str) -> None:
    with pytest.raises(ContractsError) as refused:
        parse_contracts(_alias_bomb(7, where), "bomb.yaml")  # 10**7 strings from 800 bytes
    assert str(refused.value) == ("bomb.yaml: its YAML aliases expand it to more than 100,000 "
                                  "values (an alias repeats what it names)")
    assert parse_contracts(_alias_bomb(2, "enum"))["x"].schemas  # a few aliases are fine


def test_a_bomb_padded_with_values_written_out_is_refused_too() -> None:
    """The values a file writes out were counted up to the limit only: 10,000 of them beside
    the bomb made it pass (and hang the run in the schema's checks)."""
    padding = "      pad:\n        examples: [" + ", ".join(["0"] * 10_000) + "]\n"
    bomb = _alias_bomb(7, "enum").replace("    schemas:\n", "    schemas:\n" + padding)
    with pytest.raises(ContractsError) as refused:
        parse_contracts(bomb, "bomb.yaml")
    found = re.fullmatch(r"bomb\.yaml: its YAML aliases expand it to more than ([\d,]+) "
                         r"values \(an alias repeats what it names\)", str(refused.value))
    assert found and 100_000 < int(found.group(1).replace(",", "")) < 101_000  # 10x written
    padded = parse_contracts(_alias_bomb(4, "enum").replace(  # 10**4 values, as many written
        "    schemas:\n", "    schemas:\n" + padding))
    assert len(padded["x"].schemas["a"]["enum"]) == 10


@pytest.mark.parametrize("limit", [4300, 0, 100_000])  # Python's default; lifted; raised
def test_an_integer_beyond_4300_digits_in_a_contracts_file_is_named_as_such(limit: int) -> None:
    """The limit is docs/spec.md's, whatever this process's own (``PYTHONINTMAXSTRDIGITS=0``
    refused every hexadecimal integer)."""
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit)
    try:
        for big in ("9" * 4301, "-" + "9" * 4301, "0x" + "f" * 3600):
            with pytest.raises(ContractsError) as refused:
                parse_contracts(f"contracts:\n  - name: x\n    deadline_s: {big}\n", "big.yaml")
            assert str(refused.value) == \
                "big.yaml: not valid YAML: an integer of more than 4,300 digits"
        loaded = parse_contracts("contracts:\n  - name: x\n    required: [a]\n"
                                 "    deadline_s: 0x10\n")
    finally:
        sys.set_int_max_str_digits(before)
    assert loaded["x"].deadline_s == 16


def test_a_process_that_lowered_the_digit_limit_names_its_own() -> None:
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        with pytest.raises(ContractsError) as refused:
            parse_contracts(f"contracts:\n  - name: x\n    deadline_s: {'9' * 1000}\n", "big.yaml")
    finally:
        sys.set_int_max_str_digits(before)
    assert str(refused.value) == "big.yaml: not valid YAML: an integer of more than 640 digits"


# ----------------------------------------------------------------------------- source scan
RUFF = Path(sys.executable).with_name("ruff")


def test_no_input_reaches_pickle_eval_or_a_shell() -> None:
    """ruff's security rules (flake8-bandit ``S``: pickle, eval/exec, shells, subprocess,
    unsafe YAML, SQL built from input...) pass on the whole package; each exception is a
    ``noqa`` with its reason in the code."""
    assert RUFF.exists(), f"{RUFF} is missing: install the dev extra"
    done = subprocess.run([str(RUFF), "check", "--select", "S", "--no-cache", str(FANIN)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_security_rules_would_catch_each_dangerous_call(tmp_path: Path) -> None:
    samples = {"S307": "x = eval(s)\n", "S102": "exec(code)\n",
               "S301": "import pickle\npickle.loads(b)\n",
               "S605": "import os\nos.system(cmd)\n", "S404": "import subprocess\n",
               "S602": "import subprocess\nsubprocess.run(c, shell=True)\n",
               "S506": "import yaml\nyaml.load(t)\n"}
    for code, text in samples.items():
        path = tmp_path / f"{code}.py"
        path.write_text(text)
        done = subprocess.run([str(RUFF), "check", "--select", "S", "--preview", "--no-cache",
                               "--output-format", "concise", str(path)],
                              capture_output=True, text=True, timeout=60)
        assert code in done.stdout, (code, done.stdout)


# ----------------------------------------------------------------------------- query
@pytest.fixture
def outputs(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    for kind in ("closes", "late", "dead_letter"):
        (out / kind).mkdir(parents=True)
    (out / "dead_letter" / "dead_letter-all-p0000-s000.jsonl").write_text(json.dumps(
        {"error": "invalid_json", "detail": "x", "raw": "{", "source": {"kind": "file"}}) + "\n")
    return out


@pytest.mark.parametrize("sql", [
    "COPY dead_letter TO '{target}'",
    "COPY (SELECT 1) TO '{target}' (FORMAT csv)",
    "EXPORT DATABASE '{target}'",
    "ATTACH '{target}' AS evil",
    "CREATE TABLE t AS SELECT 1",
    "INSERT INTO _dead_letter SELECT * FROM _dead_letter",
    "SET enable_external_access = true",
    "INSTALL httpfs",
    "SELECT 1; COPY (SELECT 1) TO '{target}'",
    "SELECT * FROM read_csv('{secret}')",
    "SELECT * FROM read_text('{secret}')",
    "SELECT * FROM glob('{parent}/*')",
])
def test_query_cannot_write_or_read_files(outputs: Path, tmp_path: Path, sql: str) -> None:
    target, secret = tmp_path / "written.csv", tmp_path / "secret.txt"
    secret.write_text("do-not-read\n")
    statement = sql.format(target=target, secret=secret, parent=tmp_path)
    with pytest.raises((QueryRefused, Exception)) as info:
        text = run_query(outputs, statement, fmt="csv")
        assert "do-not-read" not in text and "secret.txt" not in text
        raise AssertionError("accepted")
    assert not isinstance(info.value, AssertionError), statement
    assert not target.exists()
    # the second layer alone (no statement filter) refuses file access too
    con = open_outputs(outputs)
    try:
        with pytest.raises(Exception):  # noqa: B017 - duckdb raises several error classes
            con.execute(f"COPY (SELECT 1) TO '{target}'")
        with pytest.raises(Exception):  # noqa: B017
            con.execute("SET enable_external_access = true")
    finally:
        con.close()
    assert not target.exists()


def test_query_cli_refuses_copy(outputs: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "cli.csv"
    assert main(["query", str(outputs), f"COPY dead_letter TO '{target}'"]) != 0
    assert not target.exists()
    assert main(["query", str(outputs), "select count(*) as n from dead_letter",
                 "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 1}]


# ----------------------------------------------------------------------------- logs
def _marked_input(path: Path) -> None:
    lines = []
    for j in range(6):
        jid = f"log-{j}"
        lines.append({"kind": "open", "join_id": jid, "opened_at": "2026-01-01T00:00:00Z",
                      "contract": "triage", "note": MARKER})
        for branch in ("retrieve", "verify", "rank", "enrich"):
            lines.append({"join_id": jid, "branch": branch, "status": "ok",
                          "event_time": "2026-01-01T00:00:01Z",
                          "key": "score" if branch == "rank" else branch,
                          "value": 0.5 if branch == "rank" else {"text": MARKER}})
        lines.append({"join_id": jid, "branch": "verify", "status": "error", "attempt": 2,
                      "error": MARKER, "event_time": "2026-01-01T00:00:02Z"})
    text = "\n".join(json.dumps(x) for x in lines)
    text += f'\n{{"join_id": "bad", "value": "{MARKER}"\n[1, "{MARKER}"]\n'
    path.write_text(text)


def test_logs_never_contain_receipt_values(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                           capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    monkeypatch.setenv("FANIN_API_TOKEN", FAKE_SECRET)
    src = tmp_path / "marked.jsonl"
    _marked_input(src)
    out = tmp_path / "out"
    caplog.set_level(logging.DEBUG)
    code = main(["run", "--input", str(src), "--contracts", CONTRACTS_PATH, "--output",
                 str(out), "--log-closes", "--runner=FnApiRunner"])
    assert code == 0
    printed = capsys.readouterr()
    events = [json.loads(r.getMessage()) for r in caplog.records if r.name == "fanin.close"]
    assert len(events) == 6 and {e["event"] for e in events} == {"join_closed"}
    assert MARKER in (out / "closes").joinpath("closes-all-p0000-s000.jsonl").read_text()
    everything = caplog.text + printed.out + printed.err + "\n".join(
        r.getMessage() for r in caplog.records)
    assert MARKER not in everything
    assert FAKE_KEY not in everything and FAKE_SECRET not in everything
    assert not KEY_LIKE.search(everything), KEY_LIKE.search(everything)


# ----------------------------------------------------------------------------- credentials
@pytest.mark.parametrize("command", [[], ["run"], ["simulate"], ["publish"], ["query"],
                                     ["report"]])
def test_help_prints_no_credentials(command: list[str], capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/" + FAKE_KEY + ".json")
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert "usage:" in text
    assert FAKE_SECRET not in text and FAKE_KEY not in text
    assert not KEY_LIKE.search(text)


def test_key_pattern_is_not_blind() -> None:
    for sample in (FAKE_KEY, "api_key=abcdef123456", "-----BEGIN RSA PRIVATE KEY-----",
                   '"private_key": "x"', "ghp_" + "a" * 36):
        assert KEY_LIKE.search(sample), sample
