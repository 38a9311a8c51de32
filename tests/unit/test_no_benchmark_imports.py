"""Tests do not import ``benchmarks/`` (issue 37): what a test and a benchmark both need
lives in the testing package (``tests/support/``) or in the product, and benchmarks
import it from there. The testing package itself never imports a benchmark (benchmarks
import it, so that would be a circle).

The exceptions are tests OF a benchmark tool: the tool is the thing under test and has no
home in the product or the testing package. Each is listed below with what it tests; a
file that stops importing a benchmark must leave the list, and no other may join it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Test files that import ``benchmarks``, each because a benchmark tool is under test.
ALLOWED = {
    # The end-to-end benchmark: its flags, its per-client split, its report table, and a
    # tiny run of the whole script.
    "tests/integration/test_bench_e2e.py": "benchmarks/bench_e2e.py, run tiny",
    "tests/unit/test_bench_e2e_args.py": "bench_e2e's flags, e2e_nodes/e2e_pool/e2e_report",
    # The capacity phase and its clock (achieved over predicted) of the e2e benchmark.
    "tests/unit/test_e2e_capacity.py": "benchmarks/e2e_capacity.py's repeats",
    "tests/unit/test_e2e_clock.py": "benchmarks/e2e_clock.py's prediction",
    # The load benchmark and its report.
    "tests/integration/test_bench_load.py": "benchmarks/bench_load.py, run tiny",
    "tests/unit/test_load_report.py": "benchmarks/load_report.py's table and plot",
    # The GPU gate's own code path on a CPU, and its judgement of drafts.
    "tests/integration/test_gpu_gate.py": "benchmarks/gpu_gate.py --size tiny",
    "tests/unit/test_gpu_gate_checks.py": "gpu_gate.drafts_verified",
    # Benchmarks run on CPU with the tiny models: the same code the GPU runs.
    "tests/unit/test_bench_invariant_cost.py": "benchmarks/bench_invariant_cost.py",
    "tests/unit/test_engine_prefill_bench.py": "benchmarks/engine_prefill.py",
    "tests/unit/test_step_trace.py": "benchmarks/step_trace.py (bench_engine --trace-dir)",
    "tests/unit/test_bench_scheduler_host.py": "benchmarks/bench_scheduler_host.py",
    # Simulators that exist only to be benchmarks.
    "tests/unit/test_bench_kv_arena.py": "benchmarks/bench_kv_arena.py's KV-layout simulation",
    "tests/unit/test_pipeline_sim.py": "benchmarks/pipeline_sim.py",
    # How every benchmark stamps and scrubs the JSON it writes.
    "tests/unit/test_result_stamps.py": "benchmarks/stamp.py",
}


def benchmark_imports(path: Path) -> list[str]:
    """``line: module`` for every import of ``benchmarks`` in the file, nested ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{node.lineno}: {n}" for n in names
                  if n == "benchmarks" or n.startswith("benchmarks.")]
    return found


def test_tests_import_no_benchmark_but_the_listed() -> None:
    importers = {str(p.relative_to(ROOT)): benchmark_imports(p)
                 for p in sorted((ROOT / "tests").rglob("*.py"))}
    importers = {k: v for k, v in importers.items() if v}
    unlisted = {k: v for k, v in importers.items() if k not in ALLOWED}
    assert not unlisted, (
        "tests import benchmarks/: move what both need to tests/support/ (or the product) "
        f"and import it from there: {unlisted}")
    gone = sorted(set(ALLOWED) - set(importers))
    assert not gone, f"these no longer import benchmarks/: take them off ALLOWED: {gone}"


def test_the_check_sees_every_form_of_import(tmp_path: Path) -> None:
    f = tmp_path / "t.py"
    f.write_text("import benchmarks\nimport benchmarks.x as y\nfrom benchmarks import z\n"
                 "from benchmarks.w import v\nimport benchmarksish\nfrom . import benchmarks\n"
                 "def f():\n    from benchmarks.n import m\n")
    assert benchmark_imports(f) == ["1: benchmarks", "2: benchmarks.x", "3: benchmarks",
                                    "4: benchmarks.w", "8: benchmarks.n"]
