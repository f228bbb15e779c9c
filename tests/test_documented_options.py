"""Every option of every ``fanin`` command is named in the documents users read (README.md,
docs/*.md): a review found 24 options that only ``--help`` named."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from fanin.cli import _PLUGINS, _parser

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["run", *_PLUGINS]


def _documents() -> str:
    return "\n".join(path.read_text(encoding="utf-8")
                     for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def _options(command: str) -> list[str]:
    parser = _parser(command)
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(option for action in sub.choices[command]._actions
                  for option in action.option_strings
                  if option.startswith("--") and option != "--help")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_is_documented(command: str) -> None:
    documents = _documents()
    options = _options(command)
    assert options or command == "setup"
    undocumented = [option for option in options
                    if not re.search(re.escape(option) + r"(?![\w-])", documents)]
    assert undocumented == []
