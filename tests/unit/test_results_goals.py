"""Issue 39's goals table: computed from its runs, each verdict the figure against the goal.

The table in ``docs/results/engine-gpu.md`` is rendered by ``tools/results_goals.py``;
these tests build runs by hand so that a verdict on either side of each goal is seen,
and check the prose beside the rendered table against the final run's files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.tools import load_tool

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
render = load_tool("render_results")  # registers the table modules, as the docs build does
goals_39 = render.KINDS["goals-39"]


def _level(name: str, rate: float, ratio: float, in_server: float) -> dict[str, Any]:
    return {"config": {"name": name}, "levels": [{
        "rate_per_s": rate, "requests": 96, "itl_ms_p50": 10.0, "itl_ms_p99": 10.0 * ratio,
        "itl_p99_over_p50": ratio, "in_server_over_engine": in_server, "meets_slo": True}]}


def _runs(step_ms: float = 5.0, bf16_prefill: float = 52.0, fp8_prefill: float = 41.0,
          step_ratio: float = 1.3, prefill_ratio: float = 1.3, itl_ratio: float = 2.0,
          in_server: float = 1.05, int4_ms: float = 46.0, vision_ms: float = 7.5,
          ) -> list[tuple[str, dict[str, Any]]]:
    stamp = {"stamp": {"commit": "abcdef0123", "device": "NVIDIA H200"}}
    return [
        ("engine", {**stamp, "steps": [{"B": 1, "k": 0, "ms": step_ms}],
                    "prefill_ms": bf16_prefill, "replay_only_ms": {"B1_q1": step_ms - 0.4},
                    "profile": {"B1_k0": {"device_total_ms": step_ms - 0.6}}}),
        ("fp8", {**stamp, "prefill_ms": {"model": bf16_prefill, "fp8": fp8_prefill},
                 "agreement": {"answers_identical": 0.0, "prompts": 16}}),
        ("invariant", {**stamp, "comparison": {
            "steps": [{"B": 16, "k": 8, "ratio": step_ratio, "default_ms": 9.0,
                       "invariant_ms": 9.0 * step_ratio}],
            "prefill": {"ratio": prefill_ratio, "default_ms": 52.0,
                        "invariant_ms": 52.0 * prefill_ratio}}}),
        ("load-b1", {**stamp, "configs": [_level("whole", 0.2, 1.3, in_server)]}),
        ("load-8rps", {**stamp, "configs": [_level("mixed512", 8, itl_ratio, in_server),
                                            _level("slack", 8, itl_ratio - 0.3, 1.0)]}),
        ("edge", {**stamp, "engines": {"static": {"prefill_ms": 46.0, "prefill_tokens": 737},
                                       "static_int4": {"prefill_ms": int4_ms,
                                                       "prefill_tokens": 737}}}),
        ("vision", {**stamp, "vision": {"onnx": {
            "total_ms": vision_ms, "clip_ms": vision_ms - 1.3, "name": "onnx (CUDA)",
            "without_cuda_graphs": {"total_ms": vision_ms + 0.7}}}}),
    ]


def _verdicts(runs: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """The table's rows by measure: measure -> the "met" cell."""
    lines = goals_39(runs)
    rows = [line.split(" | ") for line in lines[2:] if line.startswith("| ")]
    return {row[0].lstrip("| "): row[-1].rstrip(" |") for row in rows}


def test_every_goal_is_a_row_with_its_commit_and_the_device_named() -> None:
    lines = goals_39(_runs())
    assert len([line for line in lines if line.startswith("| ")]) == 1 + 8
    assert all("(abcdef0)" in line for line in lines[2:10])
    assert lines[-1] == "Device: NVIDIA H200."


@given(step=st.floats(3.0, 6.0), vision=st.floats(2.0, 9.0), int4=st.floats(20.0, 140.0),
       ratio=st.floats(1.0, 1.5))
def test_a_verdict_is_the_figure_against_its_goal(step: float, vision: float, int4: float,
                                                 ratio: float) -> None:
    met = _verdicts(_runs(step_ms=step, vision_ms=vision, int4_ms=int4, step_ratio=ratio,
                          prefill_ratio=ratio))
    assert met["cloud step, B = 1, k = 0"] == ("yes" if step <= 4.2 else "no")
    assert met["five frames → aligned features, ORT CUDA EP"] == (
        "yes" if vision <= 4.0 else "no")
    assert met["edge int4 prefill"] == ("yes" if int4 / 46.0 <= 2.0 else "no")
    assert met["`--batch-invariant` step, B = 16, k = 8"] == ("yes" if ratio <= 1.2 else "no")


def test_the_prefill_says_which_dtype_met_it() -> None:
    assert _verdicts(_runs(bf16_prefill=52.0, fp8_prefill=41.0))[
        "prefill, 2,103 tokens"] == "bf16: no; fp8 (opt-in): yes"
    assert _verdicts(_runs(bf16_prefill=44.0, fp8_prefill=41.0))[
        "prefill, 2,103 tokens"] == "bf16: yes; fp8 (opt-in): yes"


def test_the_itl_verdict_is_per_configuration_and_the_loop_verdict_over_all() -> None:
    met = _verdicts(_runs(itl_ratio=1.75))  # mixed512 1.75, slack 1.45
    assert met["ITL p99 ÷ p50, 8 req/s"] == "mixed512: no; slack: yes"
    assert _verdicts(_runs(in_server=1.11))["in-server ÷ engine step"] == "no"
    assert _verdicts(_runs(in_server=1.10))["in-server ÷ engine step"] == "yes"


def test_a_missing_or_unknown_role_is_named() -> None:
    runs = [(role, run) for role, run in _runs() if role != "vision"]
    with pytest.raises(ValueError, match=r"missing \['vision'\]"):
        goals_39(runs)
    with pytest.raises(ValueError, match=r"unknown \['visoin'\]"):
        goals_39([*runs, ("visoin", {})])


def test_an_engine_run_without_the_b1_step_is_named() -> None:
    runs = [(role, {**run, "steps": [{"B": 4, "k": 0, "ms": 6.0}]} if role == "engine"
             else run) for role, run in _runs()]
    with pytest.raises(ValueError, match="B = 1, k = 0"):
        goals_39(runs)


def _final(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def test_the_bounds_quoted_beside_the_final_table_are_its_files() -> None:
    page = (ROOT / "docs" / "results" / "engine-gpu.md").read_text()
    section = page[page.index("## Issue 39's final measurements"):
                   page.index("### Where they stood before the final run")]
    section = " ".join(section.split())
    engine = _final("engine_h200-a190116.json")
    kernels = engine["profile"]["B1_k0"]
    assert (f"the GEMMs {kernels['gemm']:.2f}, attention {kernels['attention']:.2f}, "
            f"the rest {kernels['other']:.2f}") in section
    weights_ms = engine["weight_GB"] / engine["copy_bandwidth_GBps"] * 1e3
    assert f"({engine['copy_bandwidth_GBps'] / 1e3:.2f} TB/s) take {weights_ms:.2f} ms" \
        in section
    assert f"at {weights_ms / kernels['gemm']:.0%} of it" in section
    step = next(s for s in engine["steps"] if s["B"] == 1 and s["k"] == 0)
    assert f"the replay ({engine['replay_only_ms']['B1_q1']:.2f}) and the step " \
           f"({step['ms']:.2f})" in section
    cost = _final("batch-invariant-cost-h200-a190116.json")
    assert all(v == 1.0 for k, v in cost["invariant"]["invariance"].items()
               if k.endswith("_bitwise"))
    prefill = cost["comparison"]["prefill"]
    gap = prefill["invariant_ms"] - prefill["default_ms"]
    assert f"of the {gap:.1f} ms difference" in section
    vision = _final("edge-vision-h200-a190116.json")["vision"]
    assert f"{vision['torch']['clip_ms']:.2f} in torch eager bf16" in section
    load = _final("load-h200-a190116-b1.json")["configs"][0]["levels"][0]
    assert f"every {load['in_server_over_engine']:.2f}× its device time" in section
