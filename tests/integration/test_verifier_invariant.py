"""The key invariant over real gRPC: greedy speculative output == target-only == generate()."""

from __future__ import annotations

import pytest
import pytest_asyncio

from cloud.server import VerifierServer
from cloud.target import TargetModel
from shared.demoworld.tiny_target import build_tiny_random_target
from tests.integration import cloud_harness as h

QUESTIONS = [
    "What is moving?",
    "Which way does the car go?",
    "Describe the scene.",
    "How many objects are there?",
    "Is it fast or slow?",
]
# 25 (question, clip seed) cases; max_new_tokens varies so EOS and the cap both occur.
CASES = [(QUESTIONS[i % len(QUESTIONS)], 1000 + i, 8 + (i % 3) * 8) for i in range(25)]
PATTERNS = ["none", "perfect", "all_wrong", "random_wrong", "stale", "hidden_perfect",
            "hidden_wrong", "duplicated_late"]

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> VerifierServer:
    srv = await h.start_verifier(max_sessions=4)
    yield srv
    await srv.stop(0)


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


@pytest.mark.parametrize(("question", "clip_seed", "max_new"), CASES)
async def test_all_draft_patterns_equal_target_only_and_generate(
    server: VerifierServer, target: TargetModel, question: str, clip_seed: int, max_new: int
) -> None:
    frames = h.make_frames(clip_seed)
    reference = h.target_greedy(target, question, frames, max_new)
    base = await h.run_generate(
        server.port, h.open_msg(question, frames, max_new_tokens=max_new, speculative=False)
    )
    assert base.tokens == reference, "target-only over gRPC differs from HF generate()"
    assert base.done.stats.drafted == 0

    vocab = target.text_vocab_size
    truth = reference
    pattern = PATTERNS[clip_seed % len(PATTERNS)]
    hidden = None
    policy = None
    extra = []
    if pattern == "perfect":
        policy = h.perfect(truth)
    elif pattern == "all_wrong":
        policy = h.all_wrong(truth, vocab)
    elif pattern == "random_wrong":
        policy = h.random_wrong(truth, vocab, seed=clip_seed)
    elif pattern == "stale":
        policy = h.stale(truth, vocab)
    elif pattern == "hidden_perfect":
        hidden, policy = truth[:10], h.perfect(truth, k=3)
    elif pattern == "hidden_wrong":
        hidden, policy = [(t + 3) % vocab for t in truth[:10]], h.all_wrong(truth, vocab)
    elif pattern == "duplicated_late":
        # The same tail twice, then a tail re-sent after it was committed.
        extra = [h.drafts_msg(0, truth[:4]), h.drafts_msg(0, truth[:4])]
        policy = lambda b, _c: list(truth[max(0, b - 2) : b + 4])  # noqa: E731

    spec = await h.run_generate(
        server.port,
        h.open_msg(question, frames, max_new_tokens=max_new),
        hidden=hidden,
        policy=policy,
        extra=extra,
    )
    assert spec.tokens == reference, f"speculative ({pattern}) differs from target-only"
    stats = spec.done.stats
    assert 0 <= stats.accepted <= stats.drafted
    if pattern in ("perfect", "hidden_perfect") and len(truth) > 2:
        assert stats.accepted > 0
        assert stats.target_steps < len(truth)
    if pattern == "all_wrong":
        assert stats.accepted == 0
    if pattern == "all_wrong" and stats.drafted:
        # Done reports the plan re-run with the acceptance this request observed.
        assert spec.done.final_plan is not None
        assert spec.done.final_plan.acceptance_estimate < 0.5
    if pattern == "perfect" and stats.drafted:
        assert spec.done.final_plan is not None
        assert spec.done.final_plan.acceptance_estimate > 0.5
    if pattern == "hidden_perfect":
        assert stats.hidden_drafted > 0 and stats.hidden_accepted > 0


async def test_perfect_drafts_cut_target_steps(server: VerifierServer, target: TargetModel):
    frames = h.make_frames(5)
    truth = h.target_greedy(target, "What is moving?", frames, 24)
    out = await h.run_generate(
        server.port, h.open_msg("What is moving?", frames, max_new_tokens=24),
        hidden=truth[:12], policy=h.perfect(truth, k=12),
    )
    assert out.tokens == truth
    s = out.done.stats
    assert s.mean_accepted_length > 2.0, s
    assert s.target_steps <= len(truth) // 2
