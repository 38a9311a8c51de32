"""Benchmarks reach the engines through public names only (issue 37): a benchmark that
reads or swaps ``engine._something`` breaks silently when the engine's insides change,
and tells a reader that the public surface is not enough. ``torch.ops`` and torch's
own underscored functions (``torch._scaled_mm``) are exempt: core's private kernels
are what some probes measure."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def private_reaches(source: str) -> list[tuple[int, str]]:
    """(line, expression) of each ``x._name`` in ``source`` whose ``x`` is not self/cls."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if ast.unparse(owner).startswith("torch.ops") or ast.unparse(owner) == "torch":
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_benchmark_reaches_a_private_name() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}: {expr}"
             for p in sorted((ROOT / "benchmarks").glob("*.py"))
             for line, expr in private_reaches(p.read_text())]
    assert not found, "\n".join(found)


def test_the_check_sees_a_private_reach_and_lets_the_rest_be() -> None:
    source = ("def f(engine, self):\n"
              "    a = engine._graphs\n"
              "    b = self._mine, engine.__class__, torch.ops.aten._weight_int4pack_mm\n"
              "    c = torch._scaled_mm, torch.cuda._lazy_init, engine.torch._x\n"
              "    return engine.step_graphs\n")
    assert private_reaches(source) == [(2, "engine._graphs"), (4, "torch.cuda._lazy_init"),
                                       (4, "engine.torch._x")]
