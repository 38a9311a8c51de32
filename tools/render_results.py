"""Fill the results pages' tables from the committed JSON, so no figure is typed by hand.

    python tools/render_results.py            # rewrite the docs' tables in place
    python tools/render_results.py --check    # exit 1, with a diff, if a page is stale

A results page (``docs/results/*.md``, or any docs page that quotes a run) is
hand-written prose with blocks the renderer owns::

    <!-- results: KIND FILE[=LABEL] ... -->
    (generated: a table, then one line per file naming it, its device, commit, date
    and command)
    <!-- /results -->

KIND is a function of ``tools/results_tables.py`` or ``results_tables_system.py``;
FILE is a JSON under ``benchmarks/results/``. Everything between the markers is
replaced on every run, and ``tests/unit/test_results_docs.py`` runs ``--check``, as
``make proto-check`` does for the stubs: a JSON re-measured, renamed or removed without
re-rendering fails the suite. The run's commit, device and date are printed where the
JSON records them (under ``stamp``, from ``benchmarks/stamp.py``, else at its top);
where it does not, the line says "not recorded" rather than guessing from git.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
BLOCK = re.compile(r"(<!-- results: (?P<spec>[^\n]*?) -->\n)(?P<body>.*?)(<!-- /results -->)",
                   flags=re.S)


def _load(name: str) -> ModuleType:
    """``tools/<name>.py``, loaded by path (tools/ is no package) and registered, so the
    second table module can import the first's helpers by name."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: Every kind of table, by the name a block gives it.
KINDS = {**_load("results_tables").KINDS, **_load("results_tables_system").KINDS,
         **_load("results_goals").KINDS}


def _stamp(result: dict[str, Any], key: str) -> str | None:
    """``key`` from the run's stamp (``benchmarks/stamp.py``, under ``"stamp"``), else from
    the top of an older JSON that recorded it there; a stamp's "unknown" is no record."""
    for where in (result.get("stamp") or {}, result.get("provenance") or {}, result):
        if isinstance(where, dict) and where.get(key) not in (None, "", "unknown"):
            return str(where[key])
    return None


def provenance(name: str, result: dict[str, Any]) -> str:
    """One line: the file, then what it records of where and how it was measured."""
    parts = [f"`benchmarks/results/{name}`"]
    for key in ("device", "commit", "date"):
        value = _stamp(result, key)
        if key == "commit" and value:
            value = value[:12] + (" (with uncommitted changes)"
                                  if _stamp(result, "dirty") in ("True", "true") else "")
            if _stamp(result, "backfilled"):  # benchmarks/stamp.py's marker for older runs
                value += " (backfilled: the commit that added the file; the run may be older)"
        parts.append(f"{key} {value or 'not recorded'}")
    command = _stamp(result, "command")
    if command:
        parts.append(f"command `{command}`")
    return "Data: " + " · ".join(parts)


def render_block(spec: str) -> str:
    """The generated body of one block (without its markers)."""
    kind, *files = shlex.split(spec)
    if kind not in KINDS:
        raise SystemExit(f"unknown results kind {kind!r} (known: {sorted(KINDS)})")
    runs = []
    lines: list[str] = []
    for arg in files:
        name, _, label = arg.partition("=")
        path = RESULTS / name
        if not path.is_file():
            raise SystemExit(f"{path.relative_to(ROOT)} does not exist (renamed? re-point "
                             "the page's block)")
        result = json.loads(path.read_text())
        runs.append((label or Path(name).stem, result))
        lines.append(provenance(name, result))
    table = KINDS[kind](runs)
    return "\n".join(table) + "\n\n" + "\n\n".join(lines) + "\n\n"


def render_page(text: str) -> str:
    """The page with every block re-rendered."""
    return BLOCK.sub(lambda m: m.group(1) + render_block(m.group("spec")) + m.group(4), text)


def pages() -> list[Path]:
    """Every docs page; those without a block are left as they are."""
    return sorted(DOCS.rglob("*.md"))


def stale() -> list[tuple[Path, str]]:
    """(page, unified diff) for every page whose blocks differ from the JSON."""
    out = []
    for page in pages():
        old = page.read_text()
        new = render_page(old)
        if new != old:
            rel = str(page.relative_to(ROOT))
            diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                rel, rel + " (rendered)"))
            out.append((page, diff))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 and print a diff if a page is stale")
    args = ap.parse_args(argv)
    found = stale()
    if args.check:
        for _, diff in found:
            sys.stdout.write(diff)
        if found:
            print(f"{len(found)} results page(s) are stale: run python tools/render_results.py")
        return 1 if found else 0
    for page, _ in found:
        page.write_text(render_page(page.read_text()))
        print(f"rendered {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
