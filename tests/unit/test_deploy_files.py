"""The deploy files install what the nodes need: each image installs its node's extra,
and every extra named anywhere under deploy/ exists in pyproject.toml."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
    "optional-dependencies"])


@pytest.mark.parametrize("node", ["cloud", "edge"])
def test_each_image_installs_its_nodes_extra(node: str) -> None:
    dockerfile = (ROOT / "deploy" / "docker" / f"{node}.Dockerfile").read_text()
    installs = re.findall(r"pip install [\"']?\.(\[[a-z,]+\])?[\"']?", dockerfile)
    assert installs, f"{node}.Dockerfile installs no eventspec"
    assert all(f"[{node}]" in extra for extra in installs), installs


def test_every_extra_named_under_deploy_exists() -> None:
    named: set[str] = set()
    for path in (ROOT / "deploy").rglob("*"):
        if path.is_file() and path.suffix in {"", ".md", ".Dockerfile", ".yaml", ".yml", ".sh"}:
            for group in re.findall(r"eventspec\[([a-z,]+)\]|\"\.\[([a-z,]+)\]\"",
                                    path.read_text(errors="replace")):
                named.update(x for g in group for x in g.split(",") if x)
    assert named, "no extras found: the pattern is stale"
    assert named <= EXTRAS, f"extras that pyproject.toml lacks: {sorted(named - EXTRAS)}"
