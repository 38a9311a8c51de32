"""The drafter's cache bookkeeping: after any sequence of contexts (tails that grow, get
confirmed, or are cut by a diverging Commit), the next draft's logits equal what a fresh
prefill over prompt + context gives. Logits, not just argmax: a cache holding a token
twice shifts them even when a small random model's argmax does not move."""

from __future__ import annotations

import random

import pytest
import torch

from eventspec.demoworld.tiny_draft import build_tiny_random_draft
from eventspec.edge.drafting.cache import DraftCache
from eventspec.edge.drafting.eventgpt import DraftModel

QUESTION = "What is moving?"


@pytest.fixture(scope="module")
def draft() -> DraftModel:
    return build_tiny_random_draft(seed=1)


@pytest.fixture(scope="module")
def pixels(draft: DraftModel) -> torch.Tensor:
    s = draft.image_size
    return torch.randn(5, 3, s, s, generator=torch.Generator().manual_seed(0))


def fresh_logits(draft: DraftModel, pixels: torch.Tensor, context: list[int]) -> torch.Tensor:
    """Logits [V] after prompt + context, computed from scratch."""
    state, logits = draft.prefill(QUESTION, pixels)
    if context:
        logits = draft.step(state, context)[-1]
    return logits


def test_drafts_are_greedy_and_text_only(draft: DraftModel, pixels: torch.Tensor) -> None:
    d = DraftCache(draft)
    d.prefill(QUESTION, pixels)
    seq: list[int] = []
    for _ in range(6):
        seq.append(d.draft_next(seq))
    assert all(0 <= t < draft.text_vocab_size for t in seq)
    expect: list[int] = []
    for _ in range(6):
        expect.append(draft.greedy_next(fresh_logits(draft, pixels, expect)))
    assert seq == expect


@pytest.mark.parametrize("seed", range(6))
def test_random_commit_sequences_match_fresh_state(
    draft: DraftModel, pixels: torch.Tensor, seed: int
) -> None:
    rng = random.Random(seed)
    d = DraftCache(draft)
    d.prefill(QUESTION, pixels)
    committed: list[int] = []
    tail: list[int] = []
    rolled_before = 0
    while len(committed) < 20:
        for _ in range(rng.randrange(0, 5)):
            tail.append(d.draft_next(committed + tail))
            assert d.cached_len() == d._prompt_len + len(committed) + len(tail) - 1
        agree = rng.randrange(0, len(tail) + 1)
        commit = tail[:agree]
        if rng.random() < 0.6 or not commit:  # a correction or a bonus token
            commit.append(rng.randrange(3, draft.text_vocab_size))
        diverged = commit != tail[: len(commit)]
        committed += commit
        tail = [] if diverged else tail[len(commit):]
        context = committed + tail
        token = d.draft_next(context)
        assert d.cached_len() == d._prompt_len + len(context)
        assert d.last_logits is not None
        torch.testing.assert_close(d.last_logits, fresh_logits(draft, pixels, context),
                                   rtol=1e-4, atol=1e-5)
        assert token == draft.greedy_next(d.last_logits)
        tail.append(token)
        rolled_before = d.rollbacks
    assert rolled_before > 0


def test_empty_context_reuses_the_prefill(draft: DraftModel, pixels: torch.Tensor) -> None:
    d = DraftCache(draft)
    d.prefill(QUESTION, pixels)
    first = d.draft_next([])
    second = d.draft_next([first])
    assert d.draft_next([]) == first  # back to the prompt: no stale KV survives
    assert d.cached_len() == d._prompt_len
    assert d.draft_next([first]) == second


def test_draft_before_prefill_is_an_error(draft: DraftModel) -> None:
    with pytest.raises(RuntimeError, match="before prefill"):
        DraftCache(draft).draft_next([])
