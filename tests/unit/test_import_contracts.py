"""The import-linter contracts in pyproject.toml have teeth: they hold on the tree, and
they fail when an upward import is planted in a copy of it (docs/layout.md's floors).
And no modules import each other in a circle, ``if TYPE_CHECKING:`` imports included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def test_no_contract_ignores_a_wildcard() -> None:
    for contract in PYPROJECT["tool"]["importlinter"]["contracts"]:
        for ignored in contract.get("ignore_imports", []):
            assert "*" not in ignored, (contract["name"], ignored)


def _copy_with_links(tmp: Path) -> Path:
    """The four package folders and pyproject.toml, with an ``eventspec`` folder of links
    on PYTHONPATH so grimp reads the copy instead of the installed checkout."""
    for name, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        shutil.copytree(ROOT / folder, tmp / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "models"))
        link = tmp / "tree" / name.replace(".", "/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(tmp / folder, target_is_directory=True)
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp / "tree"


def _lint(cwd: Path, tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


PLANTED = [
    # (file, import line, the contract that must break)
    ("shared/contract/types.py", "import eventspec.edge.ask.agent", "Every arrow points down"),
    ("shared/node/metrics.py", "import eventspec.cloud.scheduling.scheduler",
     "Every arrow points down"),
    ("edge/ask/session.py", "import eventspec.cloud.requests.sessions", "Every arrow points down"),
    ("shared/contract/codec.py", "import torch", "import no torch"),
    ("cloud/scheduling/scheduler.py", "import grpc", "gRPC is imported only by"),
    ("edge/ask/agent.py", "import transformers", "transformers is imported only by"),
    ("cloud/cli.py", "import eventspec.demoworld.train.run", "never imports a trainer"),
]


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed")
def test_contracts_hold_and_fail_on_planted_upward_imports(tmp_path: Path) -> None:
    tree = _copy_with_links(tmp_path)
    clean = _lint(tmp_path, tree)
    assert clean.returncode == 0, clean.stdout[-3000:]
    for rel, line, _ in PLANTED:
        target = tmp_path / rel
        target.write_text(target.read_text() + f"\n{line}\n")
    planted = _lint(tmp_path, tree)
    assert planted.returncode != 0
    report = " ".join(planted.stdout.split())  # import-linter wraps long lines
    for rel, line, contract in PLANTED:
        importer = "eventspec." + rel.removesuffix(".py").replace("/", ".")
        imported = line.split()[-1]
        assert f"{contract}" in report and f"{importer} -> {imported}" in report, (
            f"{line} in {rel} was not reported as breaking {contract!r}:\n"
            + planted.stdout[-3000:])
    kept = [ln for ln in planted.stdout.splitlines() if ln.endswith("KEPT")]
    assert not any(c in " ".join(kept) for _, _, c in PLANTED)


def import_cycles(graph: Any) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's,
    iterative): each is a set of modules that import each other in a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def _describe(graph: Any, cycle: list[str]) -> str:
    lines = [" <-> ".join(cycle)]
    for importer in cycle:
        for imported in cycle:
            if graph.direct_import_exists(importer=importer, imported=imported):
                for d in graph.get_import_details(importer=importer, imported=imported):
                    lines.append(f"  {importer}:{d['line_number']}: {d['line_contents']}")
    return "\n".join(lines)


def test_import_cycles_finds_a_planted_circle() -> None:
    grimp = pytest.importorskip("grimp")
    graph = grimp.ImportGraph()
    for name in ("a", "b", "c", "d"):
        graph.add_module(name)
    graph.add_import(importer="a", imported="b")
    graph.add_import(importer="b", imported="c")
    graph.add_import(importer="c", imported="a")
    graph.add_import(importer="c", imported="d")
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    """Every module's imports point one way, type-only ones too: a circle means two
    modules that cannot be understood, tested or moved apart (issue 37)."""
    grimp = pytest.importorskip("grimp")
    roots = PYPROJECT["tool"]["importlinter"]["root_packages"]
    graph = grimp.build_graph(*roots, cache_dir=None)
    assert len(graph.modules) > 100, sorted(graph.modules)  # the packages were found
    cycles = import_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(_describe(graph, c) for c in cycles)
