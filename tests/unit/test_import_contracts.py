"""The import-linter contracts in pyproject.toml have teeth: they hold on the tree, and
they fail when an upward import is planted in a copy of it (docs/layout.md's floors)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

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
    ("shared/contract/types.py", "import eventspec.edge.agent", "Every arrow points down"),
    ("shared/node/metrics.py", "import eventspec.cloud.scheduler", "Every arrow points down"),
    ("edge/session.py", "import eventspec.cloud.sessions", "Every arrow points down"),
    ("shared/contract/codec.py", "import torch", "import no torch"),
    ("cloud/scheduler.py", "import grpc", "gRPC is imported only by"),
    ("edge/agent.py", "import transformers", "transformers is imported only by"),
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
