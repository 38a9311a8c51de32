"""The packages import from this repository (PyPI has unrelated ``shared``/``edge``/``cloud``),
the dependency rule holds, and the committed stubs match protos/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["shared", "edge", "cloud"])
def test_packages_come_from_this_repository(name: str) -> None:
    module = __import__(name)
    assert Path(module.__file__).resolve().parent == ROOT / name


def _imports(package: str, skip: str = "pb") -> set[str]:
    found: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        if {"pb", skip} & set(path.relative_to(ROOT).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_dependency_rule() -> None:
    """shared imports neither node, except the demo world, which builds both nodes'
    models; the nodes never import each other."""
    assert not {"edge", "cloud"} & _imports("shared", skip="demoworld")
    assert {"edge", "cloud"} <= _imports("shared")  # the demo world is really skipped
    assert "cloud" not in _imports("edge")
    assert "edge" not in _imports("cloud")


def test_grpc_only_in_transport_modules() -> None:
    """Scheduling, verification, timing and codec logic stay free of gRPC."""
    for rel in ("cloud/decoding.py", "cloud/sampler.py", "cloud/scheduler.py",
                "cloud/generation.py", "cloud/alone.py",
                "edge/drafter.py", "shared/timing.py", "shared/codec.py", "shared/types.py"):
        tree = ast.parse((ROOT / rel).read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m == "grpc" or m.startswith("grpc.") for m in names), rel


def test_generated_stubs_match_protos() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_protos.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
