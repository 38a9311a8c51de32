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


def test_a_step_commits_when_it_ends_not_when_it_starts() -> None:
    """A step verifies the drafts there when it starts and its Commit leaves step_ms
    later (the engine runs in between): the answer ends with the last step, and the
    steps run back to back after the prefill. Committing at the step's start had the
    edge hear every verdict a step early and overstated tokens per step by up to 40%."""
    setup = Setup(alpha=0.8, tokens=64, step_ms=26.0, prefill_ms=50.0)
    out = simulate(setup, seed=3)
    assert out.tokens == 64
    assert out.ms == setup.prefill_ms + out.steps * setup.step_ms
