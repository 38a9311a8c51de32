"""The pipeline simulator (``benchmarks/pipeline_sim.py``) runs the product's edge and
cloud state machines on a virtual clock: its answers are the target's (it asserts so),
perfect drafts are used, and useless ones cost nothing but steps."""

from __future__ import annotations

from dataclasses import replace

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


def test_a_session_that_sits_out_dry_steps_verifies_more_per_step_but_answers_later() -> None:
    """SpecEdge's policy for a session with no drafts when a step starts: skip it (at
    most one in a row). Its steps then verify more, and the session itself is slower."""
    step = simulate(Setup(alpha=0.8, tokens=96, step_ms=19.0, rtt_ms=20.0), seed=4)
    sit = simulate(Setup(alpha=0.8, tokens=96, step_ms=19.0, rtt_ms=20.0, sit_out=True), seed=4)
    assert sit.tokens == step.tokens == 96
    assert sit.sat_out > 0 and step.sat_out == 0
    assert sit.tokens_per_step > step.tokens_per_step
    assert sit.ms > step.ms


def test_verifying_every_branch_accepts_at_least_what_the_likeliest_path_does() -> None:
    """``--verify tree`` (tree attention, priced but not built) accepts along any kept
    branch the answer takes: never fewer tokens a step than one path, and the answer is
    still the target's (asserted inside). With chains there is one branch: the same."""
    base = Setup(alpha=0.7, coverage=1.0, tokens=96, step_ms=19.0, rtt_ms=20.0)
    path = simulate(base, seed=5)
    tree = simulate(replace(base, verify="tree"), seed=5)
    assert tree.tokens == path.tokens == 96
    assert tree.tokens_per_step >= path.tokens_per_step
    chains = replace(base, coverage=0.0)
    assert simulate(replace(chains, verify="tree"), seed=5).steps == simulate(chains, seed=5).steps
