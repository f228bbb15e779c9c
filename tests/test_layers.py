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
