"""A streaming ``fanin run`` as a user starts it: a child process, its outputs read while it runs.

``FaninRun(args, folder)`` starts ``python -m fanin.cli run ARGS`` (stdout/stderr to files in
``folder``) in its own process group; ``until(condition, timeout_s)`` polls while it runs;
``signal(sig)`` and ``wait(timeout_s)`` stop it; ``stop()`` kills what is left (always called,
in a ``finally``). ``read_outputs(OUTPUT, kind)`` parses the finished ``*.jsonl`` files of
``OUTPUT/<kind>/``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.emulator import wait_for

__all__ = ["FaninRun", "read_outputs"]


def read_outputs(output: Path, kind: str) -> list[dict[str, Any]]:
    """Every line of the finished JSONL files in ``output/kind`` (hidden temporaries skipped)."""
    folder = output / kind
    if not folder.is_dir():
        return []
    rows = []
    for path in sorted(folder.glob("*.jsonl")):
        rows.extend(json.loads(line) for line in path.read_text(encoding="utf-8").split("\n")[:-1])
    return rows


class FaninRun:
    """One ``fanin run`` child process."""

    def __init__(self, args: list[str], folder: Path, env: dict[str, str] | None = None,
                 launcher: Path | None = None) -> None:
        """``launcher``: a script run in place of ``-m fanin.cli`` (a test double that
        injects a fault, then calls ``fanin.cli.main``)."""
        folder.mkdir(parents=True, exist_ok=True)
        program = [str(launcher)] if launcher else ["-m", "fanin.cli"]
        self.stdout_path = folder / "stdout.txt"
        self.stderr_path = folder / "stderr.txt"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, *program, "run", *args], stdout=out, stderr=err,
                stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                start_new_session=True)

    def signal(self, sig: int = signal.SIGINT) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        """The exit code; ``subprocess.TimeoutExpired`` if it is still running after the wait."""
        return self.process.wait(timeout=timeout_s)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def until(self, condition: Callable[[], Any], timeout_s: float) -> bool:
        """Poll ``condition`` (called once per poll) until it holds (True), the process exits or
        ``timeout_s`` passes (False)."""
        held = False

        def check() -> bool:
            nonlocal held
            held = bool(condition())
            return held or not self.running

        wait_for(check, timeout_s, 0.2)
        return held

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self) -> None:
        """Kill the process group if anything of it is still running."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
