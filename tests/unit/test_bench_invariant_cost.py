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


def test_a_floor_comes_from_the_measured_bandwidth_or_is_absent() -> None:
    """Issue 35: the invariant-cost run printed "6.67 ms (floor 14.32)" from a nominal
    1 TB/s. A floor is bytes over the card's measured copy rate, never above what a
    real step of those bytes took; without a measurement there is none."""
    from benchmarks.device_timing import bandwidth_floor_ms

    weights_7b, kv_2k = 13_476_839_424, 2110 * 524_288  # bf16 weights, one 2.1k session
    h100_copy = 3.0e12  # bytes/s, about what a device-to-device copy reaches on an H100
    floor = bandwidth_floor_ms(weights_7b + kv_2k, h100_copy)
    assert floor is not None and 4.0 < floor < 6.67, "under the measured 6.67 ms step"
    assert bandwidth_floor_ms(weights_7b, float("nan")) is None
    assert bandwidth_floor_ms(weights_7b, 0.0) is None


def test_the_cpu_run_records_no_floor(tmp_path: Path) -> None:
    assert main(["--tiny", "--repeats", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "batch_invariant_cost_tiny.json").read_text())
    assert result["default"]["copy_bandwidth_gb_s"] is None
    assert all(s["floor_ms"] is None for s in result["default"]["steps"])
