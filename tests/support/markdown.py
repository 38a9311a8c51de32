"""Reading the README and docs/ as a test does: code blocks, commands, links, headings.

The README and every page under docs/ are checked by the same rules (their commands
parse, their flags exist, their links and anchors resolve), so the rules live here once.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
USER_COMMANDS = ("eventspec", "eventspec-cloud", "eventspec-edge")


def pages() -> list[Path]:
    """Every Markdown page of the docs site."""
    return sorted(DOCS.rglob("*.md"))


def blocks(text: str, lang: str | None = None) -> list[str]:
    """Fenced code blocks (``lang`` None: every block), indented ones included."""
    found = re.findall(r"^ *```([a-z]*)\n(.*?)^ *```", text, flags=re.M | re.S)
    return [body for tag, body in found if lang is None or tag == lang]


def commands(text: str) -> list[list[str]]:
    """Command lines in ``sh`` blocks (continuations joined, comments and environment
    prefixes dropped) that start with one of the user's commands."""
    out = []
    for body in blocks(text, "sh"):
        for line in body.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
                words = words[1:]
            if words and words[-1] == "&":
                words = words[:-1]
            if words and words[0] in USER_COMMANDS:
                out.append(words)
    return out


def slug(heading: str) -> str:
    """A heading's anchor as GitHub (and the site's ``toc`` slugify) spells it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^ *```.*?^ *```", "", path.read_text(), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}


def links(text: str) -> list[str]:
    """Relative link targets (``path#anchor``), web addresses left out."""
    text = re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text)
            if not t.startswith(("http://", "https://", "mailto:"))]


def broken_links(page: Path) -> list[str]:
    """Links of ``page`` whose file or heading does not exist."""
    bad = []
    for target in links(page.read_text()):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        missing_heading = bool(anchor) and file.suffix == ".md" and (
            not file.exists() or anchor not in anchors(file))
        if not file.exists() or missing_heading:
            bad.append(target)
    return bad


def known_flags() -> set[str]:
    """Every ``--flag`` a page may name: the user's commands' (from their parsers), and
    the scripts' a reader runs by hand (benchmarks, tools, the health probe), read as
    text so that nothing under benchmarks/ is imported."""
    from tests.support.tools import load_tool

    flag_docs = load_tool("flag_docs")
    known = {"--help"}
    for build in flag_docs.commands().values():
        for action in flag_docs.flags(build()):
            known.update(action.option_strings)
    scripts = [*ROOT.glob("benchmarks/*.py"), *ROOT.glob("tools/*.py"),
               ROOT / "deploy/docker/grpc_health_probe.py"]
    for path in scripts:
        known.update(re.findall(r"[\"'](--[a-z0-9][a-z0-9-]*)[\"']", path.read_text()))
    return known
