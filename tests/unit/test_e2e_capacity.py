"""The capacity phase's repeats (``benchmarks/e2e_capacity.py``): both modes per repeat,
their order drawn at random (not tied to the point or the edges), the median ratio
reported with its own repeat's runs, and every repeat's answers compared."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from benchmarks.e2e_capacity import capacity_point
from benchmarks.e2e_pool import Question
from eventspec.shared.contract.types import Mode


def test_repeats_draw_the_order_and_report_the_median_ratio() -> None:
    calls: list[Mode] = []
    spec_rates = iter([100.0, 300.0, 200.0, 250.0, 150.0])

    async def fake_mode(edges: Sequence[str], questions: Sequence[Sequence[Question]],
                        mode: Mode, max_new: int) -> dict[str, Any]:
        calls.append(mode)
        rate = next(spec_rates) if mode == Mode.SPECULATIVE else 100.0
        return {"goodput_tok_s": rate, "tokens_per_step": 2.0, "answers": {"q": [1, 2]}}

    point = asyncio.run(capacity_point(["e"], [[Question("q", 0)]], 8, alpha=0.8, rtt_ms=20,
                                       repeats=5, rng=random.Random(3), run_mode=fake_mode))
    assert len(calls) == 10 and all({calls[i], calls[i + 1]} == set(Mode) - {Mode.DRAFT_ONLY}
                                    for i in range(0, 10, 2))
    firsts = [r["first"] for r in point["repeats"]]
    assert {"speculative", "target_only"} == set(firsts), "both orders occur"
    assert point["goodput_ratio"] == 2.0, "the median of 1, 3, 2, 2.5, 1.5"
    assert point["speculative"]["goodput_tok_s"] == 200.0, "that repeat's own run"
    assert point["identical_share"] == 1.0 and "answers" not in point["speculative"]


def test_the_latency_phase_orders_modes_by_a_coin_of_the_question() -> None:
    """Independent of the edge and the client: the same question, the same order; over
    the benchmark's pool about half go speculative first."""
    from benchmarks.e2e_pool import question_pool, speculative_first

    pool = question_pool(200)
    firsts = [speculative_first(q.text) for q in pool]
    assert firsts == [speculative_first(q.text) for q in pool]
    assert 0.35 < sum(firsts) / len(firsts) < 0.65


def test_offer_stats_turn_request_counters_into_rates() -> None:
    from benchmarks.e2e_capacity import offer_stats

    rows = [{"offered": 30, "dry_steps": 2, "nodes_sent": 100, "nodes_pruned": 60,
             "draft_forward_ms": 50.0, "plans_sent": 3, "sat_out": 4},
            {"offered": 10, "dry_steps": 8, "nodes_sent": 0, "nodes_pruned": 0,
             "draft_forward_ms": 30.0}]
    got = offer_stats(rows, tokens=50, verify_steps=20)
    assert got == {"offered_per_step": 2.0, "dry_step_share": 0.5,
                   "nodes_sent_per_token": 2.0, "nodes_pruned_per_token": 1.2,
                   "draft_ms_per_step": 4.0, "replans_per_request": 1.5,
                   "sat_out_share": 0.2}
    assert offer_stats(rows, tokens=0, verify_steps=0)["offered_per_step"] is None
