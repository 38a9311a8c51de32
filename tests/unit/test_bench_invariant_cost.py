"""``benchmarks/bench_invariant_cost.py`` on CPU (the tiny target): the same code the GPU
run takes, both engines built, timed and compared, and the flag's engine bitwise
invariant alone vs in a batch."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.bench_invariant_cost import main, table


def test_the_tiny_run_compares_both_engines_and_the_flag_holds(tmp_path: Path, capsys) -> None:
    assert main(["--tiny", "--repeats", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "batch_invariant_cost_tiny.json").read_text())
    assert result["partial"] is False
    assert not result["default"]["batch_invariant"] and result["invariant"]["batch_invariant"]
    points = {(s["B"], s["k"]) for s in result["comparison"]["steps"]}
    assert points == {(1, 0), (1, 8), (4, 0), (4, 8)}
    for s in result["comparison"]["steps"]:
        assert s["ratio"] == s["invariant_ms"] / s["default_ms"] > 0
    inv = result["invariant"]["invariance"]
    bitwise = [v for k, v in inv.items() if k.endswith("_bitwise")]
    assert bitwise and all(v == 1.0 for v in bitwise)
    printed = capsys.readouterr().out
    assert table(result) in printed and "| prefill (" in printed
