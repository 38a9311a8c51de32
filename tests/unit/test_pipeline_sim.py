"""The pipeline simulator (``benchmarks/pipeline_sim.py``) runs the product's edge and
cloud state machines on a virtual clock: its answers are the target's (it asserts so),
perfect drafts are used, and useless ones cost nothing but steps."""

from __future__ import annotations

from benchmarks.pipeline_sim import Setup, simulate


def test_perfect_drafts_fill_steps_and_useless_ones_leave_one_token_a_step() -> None:
    perfect = simulate(Setup(alpha=1.0, tokens=96, step_ms=20.0), seed=1)
    useless = simulate(Setup(alpha=0.0, tokens=96, step_ms=20.0), seed=1)
    assert perfect.tokens == useless.tokens == 96
    assert perfect.tokens_per_step > 3.0
    assert useless.tokens_per_step == 1.0 and useless.accepted == 0


def test_trees_answer_losslessly_and_use_their_branches() -> None:
    """q = 1: every wrong top-1 has the truth beside it; the answer is exact (asserted
    inside) and needs no more steps than chains."""
    chains = simulate(Setup(alpha=0.6, coverage=0.0, tokens=96, step_ms=20.0), seed=2)
    trees = simulate(Setup(alpha=0.6, coverage=1.0, tokens=96, step_ms=20.0), seed=2)
    assert trees.tokens == chains.tokens == 96
    assert trees.steps <= chains.steps
