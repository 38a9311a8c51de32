"""Achieved ÷ predicted for capacity points (``benchmarks/e2e_clock.py``): the run's own
step length and edge settings go into the virtual clock."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.e2e_clock import edge_settings, predict, step_ms


def run(latency: float, ttft: float, tps: float | None) -> dict[str, Any]:
    return {"latency_ms_p50": latency, "ttft_ms_p50": ttft, "tokens_per_step": tps}


def test_a_step_is_the_decode_time_over_the_verify_steps() -> None:
    assert step_ms(run(1300.0, 300.0, 2.0), max_new=101) == pytest.approx(20.0)
    assert step_ms(run(1300.0, 300.0, None), max_new=101) == pytest.approx(10.0)


def test_the_edge_arguments_the_clock_follows() -> None:
    setup, shape = edge_settings(["--oracle-coverage=0.75", "--drafts-every=3",
                                  "--tree-nodes=64", "--adapter=x.pt"])
    assert setup == {"coverage": 0.75, "drafts_every": 3.0} and shape == {"node_budget": 64}


def test_a_point_is_set_against_the_clock_at_its_own_step_length() -> None:
    """A run that reached what the clock gives reports about 1; half of it, about 0.5."""
    result = {"oracle": {"ms_per_token": 3.39, "prefill_ms": 45.0}, "edge_args": []}
    point = {"alpha": 0.8, "rtt_ms": 20.0, "clients": 16, "max_new_tokens": 64,
             "speculative": run(1000.0, 200.0, 1.0), "target_only": run(1200.0, 200.0, 1.0)}
    first = predict(result, point, seeds=3)
    assert first["spec_step_ms"] == pytest.approx(800.0 / 63)
    assert first["target_step_ms"] == pytest.approx(1000.0 / 63)
    assert first["predicted_tokens_per_step"] > 1.0
    assert first["achieved_over_predicted"] == pytest.approx(
        1.0 / first["predicted_tokens_per_step"])
