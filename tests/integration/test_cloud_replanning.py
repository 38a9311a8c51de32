"""Re-planning while a request decodes, over real gRPC (issue 36 item 5): a request whose
drafts keep failing is sent a new Plan between Commits, counted in its stats, and its
answer is still the target's own."""

from __future__ import annotations

import pytest

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.paced import PacedEngine
from eventspec.cloud.requests.replanning import EVERY_TOKENS, Replanner
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.errors import InvalidInput
from tests.support import cloud_harness as h

pytestmark = pytest.mark.asyncio

#: Six re-plan periods: a re-plan is considered every EVERY_TOKENS commits except in the
#: last period, and needs MIN_TRIALS verified drafts first. On a starved machine a tail
#: can land after its step, so drafts are verified later: with four periods, one run on
#: a loaded machine had too few verified drafts in time and sent no re-plan (its answer
#: was still the target's).
Q, N = "What is moving?", 6 * EVERY_TOKENS


async def _paced_verifier(target: TargetModel) -> VerifierServer:
    """The tiny target paced to 30 ms a step, so a tail the test writes on each Commit
    lands within the next step however busy the machine is (the bare tiny target steps
    in milliseconds, and a tail then landed steps late, too late to be verified)."""
    engine = PacedEngine(HFEngine(target), prefill_ms=50, step_ms=30)
    server = VerifierServer(h.settings(), target=target, engine=engine, cost=h.TEST_COST)
    await server.start()
    return server


async def test_failing_drafts_get_a_new_plan_and_the_same_answer() -> None:
    target = build_tiny_random_target(seed=0)
    server = await _paced_verifier(target)
    try:
        frames = h.make_frames(3)
        truth = h.target_greedy(target, Q, frames, N)

        def mostly_wrong(base: int, _committed: list[int]) -> list[int] | None:
            """The next token right, the rest wrong. The tail leaves on a Commit and lands
            while the next step runs, so that step decodes the next token alone and the
            one after finds the tail's first token committed and verifies the wrong ones
            (had it landed in time, one right and one wrong). Either way at most half of
            what is verified is accepted."""
            if base >= len(truth):
                return None
            return [truth[base], *((t + 1) % 500 for t in truth[base + 1: base + 4])]

        out = await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=N),
                                   policy=mostly_wrong)
        assert out.tokens == truth
        stats = out.done.stats
        assert stats.drafted >= 8 and 2 * stats.accepted <= stats.drafted, stats
        assert out.replans, "no Plan after the first"
        assert stats.plans_sent == len(out.replans)
        assert all(p.hidden_draft_budget == 0 and p.max_new_tokens == N for p in out.replans)
        steady = await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=N),
                                      policy=h.perfect(truth))
        assert steady.tokens == truth  # right drafts may deepen the plan, never stop it
        assert all(p.speculate for p in steady.replans), steady.replans
    finally:
        await server.stop()


async def test_a_plan_that_cannot_be_rerun_never_fails_the_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-plan is advice: one that raises stops re-planning for that request only."""
    def broken(*_args: object, **_kw: object) -> None:
        raise InvalidInput("CloudCost.prefill_base_ms: predicted prefill is 0 ms")

    monkeypatch.setattr(Replanner, "after_commit", broken)
    target = build_tiny_random_target(seed=0)
    server = await h.start_verifier(target)
    try:
        frames = h.make_frames(3)
        truth = h.target_greedy(target, Q, frames, N)
        out = await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=N),
                                   policy=h.perfect(truth))
        assert out.tokens == truth and not out.replans and out.done.stats.plans_sent == 0
    finally:
        await server.stop()
