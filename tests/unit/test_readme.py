"""README.md stays a door: short, the two commands first, and everything it says true.

The README is the landing page (issue 37): at most 300 lines, `make demo` and `make test`
on its first screen, and links into docs/ for the rest. What it does say is checked as
the docs pages are (``tests/unit/test_docs.py``): its Python parses and is the snippet a
test runs, its commands parse with their real parsers, its flags exist, its links and
anchors resolve, and every ``make`` target it names exists.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

from tests.support import markdown as md
from tests.support.tools import load_tool

README_PATH = md.ROOT / "README.md"
README = README_PATH.read_text()
flag_docs = load_tool("flag_docs")


@pytest.fixture(autouse=True)
def _no_eventspec_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("EVENTSPEC_")]:
        monkeypatch.delenv(name)


def test_the_readme_is_a_door() -> None:
    lines = README.splitlines()
    assert len(lines) <= 300, f"README has {len(lines)} lines; move the detail to docs/"
    first_screen = "\n".join(lines[:30])
    assert "`make demo`" in first_screen and "`make test`" in first_screen


def test_python_blocks_run_as_files() -> None:
    blocks = md.blocks(README, "python")
    assert blocks
    for body in blocks:
        ast.parse(body)  # a top-level ``async with`` / ``await`` is a SyntaxError


def test_the_client_snippet_is_the_one_a_test_runs() -> None:
    """``tests/integration/test_cli_first_hour.py`` runs the client page's first block."""
    page = (md.DOCS / "reference" / "client.md").read_text()
    assert md.blocks(README, "python")[0] == md.blocks(page, "python")[0]


def test_every_command_parses_with_its_parser() -> None:
    parsers = flag_docs.commands()
    commands = md.commands(README)
    assert len(commands) >= 5
    for words in commands:
        n = 3 if words[1:2] == ["toy"] else 2
        name = " ".join(words[:n])
        assert name in parsers, f"README runs an unknown command: {' '.join(words)}"
        parsers[name]().parse_args(words[n:])  # SystemExit(2) on an unknown flag


def test_every_flag_named_exists() -> None:
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", README))
    assert sorted(named - md.known_flags()) == []


def test_links_and_anchors_exist() -> None:
    assert md.links(README)
    assert md.broken_links(README_PATH) == []


def test_make_targets_named_exist() -> None:
    makefile = (md.ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    for target in set(re.findall(r"`make ([a-z-]+)", README)):
        assert target in targets, f"make {target}"
