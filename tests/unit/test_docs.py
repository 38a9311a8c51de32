"""The docs under docs/ stay true and stay a site: what the README checks, on every page.

Cheap checks, no server started and no network:

- every ``eventspec`` / ``eventspec-cloud`` / ``eventspec-edge`` command in an ``sh`` block
  parses with that command's real parser, and every ``--flag`` named exists;
- every Python block parses as a file;
- relative links and their anchors exist, and stay inside docs/ (the site has nothing
  else: a file elsewhere is named in code, not linked);
- the site's navigation (``tools/mkdocs.yml``) lists exactly the pages there are, so
  ``make docs`` in strict mode has nothing to complain of that this suite could catch;
- the ``--source`` table lists every kind the edge accepts;
- the pasted demo run is self-consistent (speedup = ratio of the medians).

``make docs`` builds the site strict on top of this (CI runs it).
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from tests.support import markdown as md
from tests.support.tools import load_tool

flag_docs = load_tool("flag_docs")
PAGES = md.pages()
#: Flags of other programs the pages show (kubectl, kubernetes-validate).
OTHER_PROGRAMS = {"--from-file", "--replicas", "--strict"}
IDS = [str(p.relative_to(md.DOCS)) for p in PAGES]


@pytest.fixture(autouse=True)
def _no_eventspec_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("EVENTSPEC_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_commands_parse_and_flags_exist(page: Path) -> None:
    text = page.read_text()
    parsers = flag_docs.commands()
    for words in md.commands(text):
        n = 3 if words[1:2] == ["toy"] else 2
        name = " ".join(words[:n])
        assert name in parsers, f"{page.name} runs an unknown command: {' '.join(words)}"
        parsers[name]().parse_args(words[n:])  # SystemExit(2) on an unknown flag
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
    known = md.known_flags() | OTHER_PROGRAMS
    # `--cloud-…` and `--emulate-…` name a family of flags by its prefix.
    unknown = sorted(f for f in named - known
                     if not (f.endswith("-") and any(k.startswith(f) for k in known)))
    assert unknown == [], f"{page.name} names flags nothing has: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_python_blocks_parse(page: Path) -> None:
    for body in md.blocks(page.read_text(), "python"):
        ast.parse(body)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_links_resolve_inside_the_site(page: Path) -> None:
    assert md.broken_links(page) == []
    for target in md.links(page.read_text()):
        path = target.partition("#")[0]
        if path:
            assert (page.parent / path).resolve().is_relative_to(md.DOCS), target


def test_the_navigation_lists_every_page() -> None:
    config = (md.ROOT / "tools" / "mkdocs.yml").read_text()
    listed = set(re.findall(r"^\s*-\s+(?:[^\n]*?:\s+)?([\w./-]+\.md)\s*$", config, flags=re.M))
    assert listed == set(IDS)


def test_make_targets_named_exist() -> None:
    makefile = (md.ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    for page in PAGES:
        for target in set(re.findall(r"`make ([a-z-]+)", page.read_text())):
            assert target in targets, f"{page.name}: make {target}"


def test_the_source_table_lists_every_kind() -> None:
    section = (md.DOCS / "reference" / "sources.md").read_text()
    tree = ast.parse((md.ROOT / "edge" / "events" / "sources.py").read_text())
    kinds: list[str] = ["toy", "synthetic"]
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and (
                node.targets[0].id in ("FILE_KINDS", "LIVE_KINDS")):
            kinds += list(ast.literal_eval(node.value))
    first_cells = re.findall(r"^\| (.*?) \|", section, flags=re.M)
    for kind in kinds:
        spelled = re.compile(rf"`{re.escape(kind)}[:`\[]")
        assert any(spelled.search(cell) for cell in first_cells), f"--source {kind} missing"
    # toy:A-B is half-open, as parse_toy_spec says.
    assert "half-open" in section and "A..B-1" in section


def test_the_demo_run_is_consistent() -> None:
    text = (md.DOCS / "getting-started.md").read_text()
    block = next(b for b in md.blocks(text) if "speedup (ratio of medians)" in b)
    spec = float(re.search(r"^  speculative\s+([\d.]+) ms", block, re.M).group(1))  # type: ignore[union-attr]
    base = float(re.search(r"^  target-only\s+([\d.]+) ms", block, re.M).group(1))  # type: ignore[union-attr]
    speedup = float(re.search(r"ratio of medians\)\s+([\d.]+)x", block).group(1))  # type: ignore[union-attr]
    assert abs(base / spec - speedup) < 0.006
    assert "identical token ids: True" in block
    assert f"from {base} ms to {spec} ms" in text.replace("\n", " ")
