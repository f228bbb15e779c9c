"""The integrations' import boundaries: no Apache Beam anywhere in them, and each framework
imported only by its own module (``fanin.integrations`` itself needs neither framework)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("apache_beam", "langgraph", "langchain_core", "google.adk")


@pytest.mark.parametrize(("module", "allowed"), [
    ("fanin.integrations", ()),
    ("fanin.integrations.fanout", ()),
    ("fanin.integrations.langgraph", ("langgraph", "langchain_core")),
    ("fanin.integrations.adk", ("google.adk",)),
])
def test_importing_a_module_loads_only_its_own_framework(module: str,
                                                         allowed: tuple[str, ...]) -> None:
    probe = (f"import sys, {module}; "
             f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                            text=True).stdout.split()
    assert sorted(loaded) == sorted(allowed)
