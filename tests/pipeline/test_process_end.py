"""``fanin``'s own process collects its young objects less often and freezes what its job
starts with (its imports), then what is left of its heap before it ends (``fanin.cli``), so
the collector and the interpreter's teardown do not walk them again and again; a caller of
``main(argv)`` keeps its process's collector as it was. The run's files and exit status are
those of any run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.child_env import same_code_env

from fanin.cli import RUN_GC_THRESHOLD
from fanin.fleet.simulate import CONTRACTS_PATH, write_simulation

_PROBE = """
import atexit, gc, json, sys
from fanin.cli import main
own, args = sys.argv[1] == "own", sys.argv[2:]
sys.argv = ["fanin", *args]
atexit.register(lambda: print("atexit ran", file=sys.stderr))
code = main() if own else main(args)
print(json.dumps({"code": code, "frozen": gc.get_freeze_count(),
                  "young": gc.get_threshold()[0]}))
"""


@pytest.mark.parametrize("own", [True, False])
def test_the_heap_is_frozen_before_fanins_own_process_ends(tmp_path: Path, own: bool) -> None:
    traffic = tmp_path / "fleet.jsonl"
    write_simulation(traffic, joins=20, seed=3)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, "own" if own else "caller", "run", "--input",
         str(traffic), "--contracts", CONTRACTS_PATH, "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300, env=same_code_env())
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["code"] == 0 and done.returncode == 0, done.stderr[-2000:]
    assert (found["frozen"] > 0) is own
    assert found["young"] == (RUN_GC_THRESHOLD if own else 700)
    assert done.stderr.rstrip().endswith("atexit ran")
    closes = [line for path in (tmp_path / "out" / "closes").glob("*.jsonl")
              for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(closes) == 20
