"""docs/reference/flags.md lists exactly the flags each user command has, so it cannot drift."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support.tools import load_tool

ROOT = Path(__file__).resolve().parents[2]
flag_docs = load_tool("flag_docs")
FLAGS_PAGE = ROOT / "docs" / "reference" / "flags.md"


def _documented() -> dict[str, set[str]]:
    text = FLAGS_PAGE.read_text()
    sections = re.split(r"^### `([^`]+)`$", text, flags=re.M)
    return {name: set(re.findall(r"^\| `(--[a-z0-9-]+)` \|", body, flags=re.M))
            for name, body in zip(sections[1::2], sections[2::2], strict=True)}


def test_every_command_has_a_flag_table() -> None:
    assert set(flag_docs.commands()) <= set(_documented())


@pytest.mark.parametrize("command", sorted(flag_docs.commands()))
def test_the_doc_lists_exactly_the_flags_of(command: str) -> None:
    parser = flag_docs.commands()[command]()
    actual = {a.option_strings[-1] for a in flag_docs.flags(parser)}
    documented = _documented()[command]
    assert actual - documented == set(), f"undocumented flags of {command}"
    assert documented - actual == set(), f"documented flags {command} no longer has"


def test_generated_rows_match_the_doc_for_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("EVENTSPEC_")]:
        monkeypatch.delenv(name)
    # The client's table is machine-independent: it must be the generator's output.
    generated = flag_docs.table("eventspec ask", flag_docs.commands()["eventspec ask"]())
    assert generated in FLAGS_PAGE.read_text()
