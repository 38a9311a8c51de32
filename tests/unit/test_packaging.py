"""Installed names cannot collide: everything installs under one ``eventspec`` namespace
(the index has unrelated ``shared``/``edge``/``cloud`` distributions), the package list
matches the tree, ``shared/`` imports neither node, and the committed stubs match protos/."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIRS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]


@pytest.mark.parametrize("name", sorted(PACKAGE_DIRS))
def test_packages_come_from_this_repository(name: str) -> None:
    module = __import__(name, fromlist=["__file__"])
    assert Path(module.__file__).resolve().parent == ROOT / PACKAGE_DIRS[name]


def test_no_bare_top_level_names_are_importable_from_the_install() -> None:
    """From outside the checkout, only ``eventspec.*`` resolves: no bare ``shared``."""
    code = ("import importlib.util as u; "
            "print([n for n in ('shared', 'edge', 'cloud', 'demoworld') if u.find_spec(n)])")
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "[]"


def test_the_package_list_matches_the_tree() -> None:
    """setuptools' ``package-dir`` mapping needs every package named; a new subpackage
    that is not listed would be missing from the wheel."""
    found = set()
    for name, folder in PACKAGE_DIRS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    assert set(PYPROJECT["tool"]["setuptools"]["packages"]) == found


def _imported_roots(folder: Path) -> set[str]:
    """``eventspec.<floor>`` of every absolute import under ``folder`` (pb excluded)."""
    found: set[str] = set()
    for path in folder.rglob("*.py"):
        if "pb" in path.relative_to(folder).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found |= {".".join(n.split(".")[:2]) for n in names if n.startswith("eventspec.")}
    return found


def test_shared_imports_neither_node_nor_the_demo_world() -> None:
    assert _imported_roots(ROOT / "shared") == {"eventspec.shared"}


def test_the_nodes_never_import_each_other() -> None:
    assert "eventspec.cloud" not in _imported_roots(ROOT / "edge")
    assert "eventspec.edge" not in _imported_roots(ROOT / "cloud")


def test_generated_stubs_match_protos() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "-q", "--disable-pip-version-check", *args],
                   check=True, capture_output=True, timeout=600)


def test_the_wheel_installs_beside_a_package_named_shared(tmp_path: Path) -> None:
    """A clean venv holding an unrelated top-level ``shared`` package: eventspec's wheel
    installs beside it and both import, each its own."""
    wheels = tmp_path / "wheels"
    # Built from a copy: setuptools writes build/ into the source tree it builds.
    src = tmp_path / "src"
    for name in ["pyproject.toml", "README.md"]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    for folder in PACKAGE_DIRS.values():
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "-q", "wheel", "--no-deps",
                    "--no-build-isolation", "-w", str(wheels), str(src)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("eventspec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert all(n.startswith(("eventspec/", "eventspec-")) for n in names), \
        sorted({n.split("/")[0] for n in names})
    assert "eventspec/cloud/models/toy-video-llava/model.safetensors" in names
    assert not any(n.startswith("eventspec/tests") or "/support/" in n for n in names)

    other = tmp_path / "other"
    (other / "shared").mkdir(parents=True)
    (other / "shared" / "__init__.py").write_text("WHO = 'the other shared'\n")
    (other / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "other-shared"\nversion = "1"\n'
        '[tool.setuptools]\npackages = ["shared"]\n')
    subprocess.run([sys.executable, "-m", "pip", "-q", "wheel", "--no-deps",
                    "--no-build-isolation", "-w", str(wheels), str(other)],
                   check=True, capture_output=True, timeout=600)

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    _pip(python, "install", "--no-deps", "--no-index", *map(str, sorted(wheels.glob("*.whl"))))
    code = ("import shared, eventspec.shared.contract.errors as e; "
            "import eventspec.shared.contract.checks; print(shared.WHO); print(e.__name__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == ["the other shared", "eventspec.shared.contract.errors"]
