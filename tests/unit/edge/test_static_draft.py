"""The static drafter drafts exactly what the HF reference drafter drafts (fp32, CPU).

Two Drafters, one on each backend, walk the same random commit sequences: tails that
grow, get confirmed, or are cut by a diverging Commit (rollbacks), with committed
tokens the draft never saw (refeeds of several tokens at once). After every step the
static backend's logits equal the reference's and every draft token is the same, on the
tiny random draft and on the shipped toy draft.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventspec.demoworld.tiny_draft import build_tiny_random_draft
from eventspec.edge.draft import DraftModel
from eventspec.edge.draft_checkpoint import load_draft
from eventspec.edge.drafter import Drafter
from eventspec.edge.model_dirs import TOY_DRAFT_DIR
from eventspec.edge.static_draft import StaticDraftBackend
from eventspec.shared.contract.errors import InvalidInput

QUESTIONS = ["What is moving?", "Which way is the object moving?", "How many objects are there?"]


@pytest.fixture(scope="module", params=["tiny", "toy"])
def pair(request: pytest.FixtureRequest) -> tuple[DraftModel, StaticDraftBackend]:
    """A draft model and a static backend over the same weights (fused in place: the HF
    modules keep computing the same values from views of the fused tensors)."""
    draft = build_tiny_random_draft(seed=3) if request.param == "tiny" else load_draft(
        TOY_DRAFT_DIR)
    return draft, StaticDraftBackend(draft)


def _pixels(draft: DraftModel, seed: int) -> torch.Tensor:
    s = draft.image_size
    return torch.randn(5, 3, s, s, generator=torch.Generator().manual_seed(seed))


def _walk(pair: tuple[DraftModel, StaticDraftBackend], seed: int, steps: int = 12) -> int:
    """One random commit sequence through both drafters; returns the rollbacks seen."""
    draft, static = pair
    rng = random.Random(seed)
    pixels = _pixels(draft, seed)
    question = QUESTIONS[seed % len(QUESTIONS)]
    ref, fast = Drafter(draft), Drafter(static)
    ref.prefill(question, pixels)
    fast.prefill(question, pixels)
    assert fast.cached_len() == ref.cached_len()
    committed: list[int] = []
    tail: list[int] = []
    for _ in range(steps):
        for _ in range(rng.randrange(0, 6)):
            context = committed + tail
            token = ref.draft_next(context)
            assert fast.draft_next(context) == token, (seed, context)
            tail.append(token)
        agree = rng.randrange(0, len(tail) + 1)
        commit = tail[:agree]
        for _ in range(rng.choice([0, 1, 1, 3])):  # corrections and unseen committed tokens
            commit.append(rng.randrange(3, draft.text_vocab_size))
        diverged = commit != tail[: len(commit)]
        committed += commit
        tail = [] if diverged else tail[len(commit):]
        context = committed + tail
        token = ref.draft_next(context)
        assert fast.draft_next(context) == token, (seed, context)
        assert ref.last_logits is not None and fast.last_logits is not None
        torch.testing.assert_close(fast.last_logits, ref.last_logits, rtol=1e-4, atol=1e-4)
        assert fast.cached_len() == ref.cached_len()
        tail.append(token)
    assert fast.rollbacks == ref.rollbacks
    return fast.rollbacks


@pytest.mark.parametrize("seed", range(4))
def test_static_drafts_equal_hf_drafts_through_rollbacks_and_refeeds(
    pair: tuple[DraftModel, StaticDraftBackend], seed: int
) -> None:
    assert _walk(pair, seed) > 0


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(min_value=100, max_value=10_000))
def test_static_drafts_equal_hf_drafts_on_random_patterns(
    pair: tuple[DraftModel, StaticDraftBackend], seed: int
) -> None:
    _walk(pair, seed, steps=6)


def test_the_prefill_logits_match_and_the_prompt_cannot_be_rolled_back(
    pair: tuple[DraftModel, StaticDraftBackend],
) -> None:
    draft, static = pair
    pixels = _pixels(draft, 0)
    ref_state, ref_logits = draft.prefill(QUESTIONS[0], pixels)
    state, logits = static.prefill(QUESTIONS[0], pixels)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert static.seq_len(state) == draft.seq_len(ref_state)
    with pytest.raises(InvalidInput, match="rollback"):
        static.rollback(state, state.prompt_len - 1)
    with pytest.raises(InvalidInput, match="out of range"):
        static.step(state, [static.runtime.weights.vocab])
    with pytest.raises(InvalidInput, match="at least one token"):
        static.step(state, [])
