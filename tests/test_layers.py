"""The package's layers hold: import-linter's contracts (pyproject.toml) and the commands that
must not load Apache Beam."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def test_import_contracts_are_kept() -> None:
    """Dependencies point down; core, contracts, analysis and the agent side import no Beam."""
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: install the dev extra"
    done = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


_PROBE = """
import contextlib, io, json, sys
from fanin.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
heavy = sorted(m for m in sys.modules
               if m.split(".")[0] in ("apache_beam", "grpc") or m.startswith("google.cloud.pubsub"))
print(json.dumps({"code": code, "heavy": heavy}))
"""


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["query", "{out}", "select count(*) from closes"],
    ["report", "{out}"],
    ["query", "--help"],
])
def test_help_query_and_report_load_no_beam(tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "closes").mkdir()
    args = [a.format(out=tmp_path) for a in argv]
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"code": 0, "heavy": []}, (found, done.stderr[-2000:])


_RE2_PROBE = """
import json, sys
from fanin.contracts.catalog import load_contracts
from fanin.contracts.schemas import first_error, validator_for
contracts = load_contracts(sys.argv[1])
schema = json.loads(sys.argv[2])
before = "re2" in sys.modules
error = first_error(validator_for(schema), "abc") if schema else None
print(json.dumps({"before": before, "after": "re2" in sys.modules, "error": error}))
"""


@pytest.mark.parametrize("schema, imported, refused", [
    ({}, False, False),  # the bundled contracts have no pattern: RE2 is never imported
    ({"type": "string", "pattern": "^b"}, True, True),
    ({"type": "string", "pattern": "^a"}, True, False),
])
def test_re2_is_imported_at_the_first_pattern_only(schema: dict[str, str], imported: bool,
                                                   refused: bool) -> None:
    done = subprocess.run([sys.executable, "-c", _RE2_PROBE,
                           str(REPO / "fanin" / "examples" / "contracts.yaml"),
                           json.dumps(schema)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["before"] is False, done.stderr[-2000:]
    assert found["after"] is imported
    assert (found["error"] is not None) is refused
