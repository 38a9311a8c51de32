"""Draw docs/layout.md's facts about the code from the code, so that none is typed by hand.

    python tools/layout_doc.py            # rewrite docs/layout.md's generated blocks
    python tools/layout_doc.py --check    # exit 1, with a diff, if the page is stale

The page is hand-written prose with blocks this script owns::

    <!-- layout: KIND -->
    (generated)
    <!-- /layout -->

KIND is one of :data:`KINDS`: ``names`` (the installed names, from ``pyproject.toml``'s
``package-dir``), ``floors`` (the layers contract's floors, each package with the first
sentence of its docstring), ``contracts`` (every import-linter contract, with its modules
and allowed exceptions), ``sizes`` (the size rule and its allow-list) and ``modules``
(every module of the installed packages with the first sentence of its docstring).
Everything between the markers is replaced on every run; ``tests/unit/test_layout_doc.py``
runs the check, and ``make docs`` does too.

The size rule: no module of the installed packages (the generated ``pb`` aside) is over
:data:`LIMIT` lines, except those in :data:`OVER_LIMIT`, each held at its length when the
rule was written: it may shrink, not grow, and no other module may join it. A module
that falls to the limit leaves the list. :func:`size_problems` says what breaks the rule.
The page names no module's current length beside these: every edit would make it stale.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "layout.md"
BLOCK = re.compile(r"(<!-- layout: (?P<kind>[a-z]+) -->\n)(?P<body>.*?)(<!-- /layout -->)",
                   flags=re.S)

#: The most lines a module may have.
LIMIT = 400
#: The modules over :data:`LIMIT` when the rule was written (issue 37), at that length.
#: None may grow; remove one once it is split (or has shrunk to the limit).
OVER_LIMIT = {
    # the domain types both nodes and every client share
    "shared/contract/types.py": 417,  # 454 until VerifierStats left it (verifier_stats.py)
    # EventGPT's model classes on stock transformers
    "edge/drafting/eventgpt.py": 451,
    # the edge process: source, draft model, cloud link and server
    "edge/server.py": 412,
}
# Left the list when they were split (issue 37): shared/node/static/runtime.py (609),
# cloud/scheduler.py (441; now cloud/scheduling/scheduler.py).
#: Generated code, outside the listing and the size rule.
GENERATED = ("shared/pb",)
#: What a package without a docstring is.
UNDOCUMENTED = {
    "eventspec.shared.pb": "The generated messages and stubs (from `protos/`, by "
                           "`tools/gen_protos.py`).",
}


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def package_dirs() -> dict[str, str]:
    """Installed name -> folder, as ``pyproject.toml`` maps them."""
    return dict(pyproject()["tool"]["setuptools"]["package-dir"])


def modules() -> list[tuple[str, Path]]:
    """(installed name, file) of every module of the installed packages but the generated."""
    out = []
    for name, folder in package_dirs().items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "__pycache__" in rel or rel.startswith(GENERATED):
                continue
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((".".join((name, *parts)), path))
    return sorted(out)


def where(name: str) -> Path:
    """The file (a module) or folder (a package) of an installed name."""
    for prefix, folder in package_dirs().items():
        if name == prefix or name.startswith(prefix + "."):
            base = ROOT / folder / name[len(prefix):].lstrip(".").replace(".", "/")
            return base if base.is_dir() else base.with_suffix(".py")
    raise SystemExit(f"{name} is no installed package")


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _markdown(text: str) -> str:
    """reST roles and literals as Markdown code; a table's pipes escaped outside code."""
    text = re.sub(r":[a-z]+:`(~?)([^`]+)`",
                  lambda m: "``" + (m[2].split(".")[-1] if m[1] else m[2]) + "``", text)
    text = text.replace("``", "`")
    pieces = text.split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(pieces))


def purpose(path: Path, name: str = "") -> str:
    """The first sentence of the docstring of a module (or of a package's ``__init__``),
    with the second when the first is short."""
    if path.is_dir():
        path = path / "__init__.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    if not first:
        return UNDOCUMENTED.get(name, "(no docstring)")
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", first)
    # "The Verifier gRPC servicer: thin." says little alone: a short one takes the next.
    sentence = " ".join(sentences[:2]) if len(sentences[0]) < 40 else sentences[0]
    return _markdown(sentence)


def _folder(name: str) -> str:
    path = where(name).relative_to(ROOT).as_posix()
    return f"`{path}/`" if where(name).is_dir() else f"`{path}`"


def names_block() -> list[str]:
    rows = ["| folder | installed as |", "|---|---|"]
    rows += [f"| `{folder}/` | `{name}` |" for name, folder in package_dirs().items()]
    return rows


def _layers() -> dict[str, Any]:
    return next(c for c in pyproject()["tool"]["importlinter"]["contracts"]
                if c["type"] == "layers")


def floors_block() -> list[str]:
    contract = _layers()
    layers = contract["layers"]
    rows = ["| floor | package | folder | what it is |", "|---|---|---|---|"]
    for i, layer in enumerate(layers):
        for name in (n.strip() for n in layer.split("|")):
            rows.append(f"| {len(layers) - 1 - i} | `{name}` | {_folder(name)} | "
                        f"{purpose(where(name), name)} |")
    rows += ["", "Packages on one floor never import each other (`a | b` in the contract). "
             "The imports the contract allows although they point up:", ""]
    rows += [f"- `{ignored}`" for ignored in contract.get("ignore_imports", [])] or ["- none"]
    return rows


def contracts_block() -> list[str]:
    out = []
    for c in pyproject()["tool"]["importlinter"]["contracts"]:
        out.append(f"- **{c['name']}** (`{c['type']}`)")

        def codes(mods: list[str]) -> str:
            return ", ".join(f"`{m}`" for m in mods)

        if c["type"] == "layers":
            out.append("  - floors, top first: " + codes(c["layers"]))
        elif c["type"] == "forbidden":
            out.append("  - these: " + codes(c["source_modules"]))
            out.append("  - import none of: " + codes(c["forbidden_modules"]))
        elif c["type"] == "protected":
            out.append("  - only these may import " + codes(c["protected_modules"]) + ": "
                       + codes(c["allowed_importers"]))
        if c.get("ignore_imports"):
            out.append("  - allowed exceptions: " + codes(c["ignore_imports"]))
        if c.get("allow_indirect_imports"):
            out.append("  - indirect imports allowed")
    return out


def over_limit() -> dict[str, int]:
    """Every module over :data:`LIMIT` lines now: path -> lines."""
    return {p.relative_to(ROOT).as_posix(): n for _, p in modules()
            if (n := lines(p)) > LIMIT}


def size_problems() -> list[str]:
    """What breaks the size rule, one line each; empty when it holds."""
    now = over_limit()
    problems = []
    for rel, n in sorted(now.items()):
        if rel not in OVER_LIMIT:
            problems.append(f"{rel} has {n} lines (limit {LIMIT}): split it by job")
        elif n > OVER_LIMIT[rel]:
            problems.append(f"{rel} grew to {n} lines (held at {OVER_LIMIT[rel]}): "
                            "split it by job, do not raise its allowance")
    for rel, allowed in sorted(OVER_LIMIT.items()):
        if rel not in now:
            state = "is gone" if not (ROOT / rel).is_file() else \
                f"has {lines(ROOT / rel)} lines, within the limit"
            problems.append(f"{rel} {state}: take it off OVER_LIMIT in tools/layout_doc.py "
                            f"(held at {allowed})")
    return problems


def sizes_block() -> list[str]:
    rows = [f"No module of the installed packages is over {LIMIT} lines (the generated "
            f"`{'`, `'.join(GENERATED)}` aside), except the {len(OVER_LIMIT)} below. Each is "
            "held at its length when the rule was written (issue 37): it may shrink, not "
            "grow, and no other module may pass the limit. A module that falls to the limit "
            "leaves the list. `tests/unit/test_layout_doc.py` checks this and names every "
            f"module over {LIMIT} lines when it fails.", "",
            "| module | at most (lines) | what it is |", "|---|---|---|"]
    rows += [f"| `{rel}` | {n} | {purpose(ROOT / rel)} |"
             for rel, n in sorted(OVER_LIMIT.items(), key=lambda kv: -kv[1])]
    return rows


def modules_block() -> list[str]:
    mods = modules()
    packages = [(n, p) for n, p in mods if p.name == "__init__.py"]
    out = [f"{len(mods)} modules in {len(packages)} packages; each line is the first "
           "sentence of the module's docstring (two when the first is short)."]
    for pkg, init in packages:
        inside = [(n, p) for n, p in mods if p.parent == init.parent and p != init]
        if not inside:
            continue
        out += ["", f"**`{pkg}`** ({_folder(pkg)}): {purpose(init, pkg)}", "",
                "| module | what it is |", "|---|---|"]
        out += [f"| `{p.name}` | {purpose(p, n)} |" for n, p in inside]
    return out


#: Every kind of block, by the name a block gives it.
KINDS: dict[str, Callable[[], list[str]]] = {
    "names": names_block, "floors": floors_block, "contracts": contracts_block,
    "sizes": sizes_block, "modules": modules_block,
}


def render_page(text: str) -> str:
    def block(m: re.Match[str]) -> str:
        kind = m.group("kind")
        if kind not in KINDS:
            raise SystemExit(f"unknown layout block {kind!r} (known: {sorted(KINDS)})")
        return m.group(1) + "\n" + "\n".join(KINDS[kind]()) + "\n\n" + m.group(4)
    return BLOCK.sub(block, text)


def stale(page: Path = PAGE) -> str:
    """A unified diff of the page against its rendering; empty when it is up to date."""
    old = page.read_text()
    new = render_page(old)
    rel = page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else str(page)
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        rel, rel + " (rendered)"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 and print a diff if the page is stale")
    args = ap.parse_args(argv)
    diff = stale()
    if args.check:
        sys.stdout.write(diff)
        if diff:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python tools/layout_doc.py")
        for problem in size_problems():
            print(f"size rule: {problem}")
        return 1 if diff or size_problems() else 0
    if diff:
        PAGE.write_text(render_page(PAGE.read_text()))
        print(f"rendered {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
