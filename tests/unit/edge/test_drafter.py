"""The drafter's cache bookkeeping: after any mix of agreeing and diverging Commits, the
next draft equals what a fresh prefill over prompt + C would propose."""

from __future__ import annotations

import random

import pytest
import torch

from edge.draft import DraftModel
from edge.drafter import Drafter
from shared.demoworld.tiny_draft import build_tiny_random_draft
from shared.errors import InvalidInput


@pytest.fixture(scope="module")
def draft() -> DraftModel:
    return build_tiny_random_draft(seed=1)


@pytest.fixture(scope="module")
def pixels(draft: DraftModel) -> torch.Tensor:
    s = draft.image_size
    return torch.randn(5, 3, s, s, generator=torch.Generator().manual_seed(0))


def fresh_next(draft: DraftModel, pixels: torch.Tensor, committed: list[int]) -> int:
    """Greedy next token after prompt + committed, computed from scratch."""
    state, logits = draft.prefill("What is moving?", pixels)
    if committed:
        logits = draft.step(state, committed)[-1]
    return draft.greedy_next(logits)


def test_drafts_are_greedy_and_text_only(draft: DraftModel, pixels: torch.Tensor) -> None:
    d = Drafter(draft, max_new_tokens=12)
    d.prefill("What is moving?", pixels)
    for _ in range(6):
        d.draft_one()
    assert all(0 <= t < draft.text_vocab_size for t in d.tail)
    # The same tokens come from plain greedy decoding.
    expect: list[int] = []
    for _ in range(6):
        expect.append(fresh_next(draft, pixels, expect))
    assert d.tail == expect


@pytest.mark.parametrize("seed", range(6))
def test_random_commit_sequences_match_fresh_state(
    draft: DraftModel, pixels: torch.Tensor, seed: int
) -> None:
    rng = random.Random(seed)
    d = Drafter(draft, max_new_tokens=40)
    d.prefill("What is moving?", pixels)
    rolled = kept = 0
    while len(d.committed) < 20:
        for _ in range(rng.randrange(0, 5)):
            if d.can_draft():
                d.draft_one()
        tail = list(d.tail)
        agree = rng.randrange(0, len(tail) + 1)
        commit = tail[:agree]
        if rng.random() < 0.6 or not commit:  # a correction or a bonus token
            commit.append(rng.randrange(3, draft.text_vocab_size))
        outcome = d.on_commit(len(d.committed), commit)
        rolled += outcome.rolled_back
        kept += outcome.kept
        assert d.sequence[: len(d.committed)] == d.committed
        # Whatever happened, the next draft is what a fresh prefill over C proposes,
        # continued from the kept tail.
        if d.can_draft():
            before = list(d.tail)
            nxt = d.draft_one()
            assert nxt == fresh_next(draft, pixels, d.committed + before)
    assert rolled > 0 and kept > 0


def test_commit_must_start_at_the_committed_length(draft: DraftModel, pixels: torch.Tensor):
    d = Drafter(draft, max_new_tokens=8)
    d.prefill("What is moving?", pixels)
    d.on_commit(0, [5])
    with pytest.raises(InvalidInput, match="starts at 0"):
        d.on_commit(0, [6])


def test_stops_at_eos_and_max_tokens(draft: DraftModel, pixels: torch.Tensor) -> None:
    d = Drafter(draft, max_new_tokens=3)
    d.prefill("What is moving?", pixels)
    while d.can_draft():
        d.draft_one()
    assert len(d.sequence) == 3
    d2 = Drafter(draft, max_new_tokens=10)
    d2.prefill("What is moving?", pixels)
    d2.on_commit(0, [7, draft.eos_token_id])
    assert not d2.can_draft()
