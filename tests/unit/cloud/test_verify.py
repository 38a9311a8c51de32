"""Greedy and rejection-sampling verification (cloud/verify.py)."""

from __future__ import annotations

import math

import pytest
import torch

from cloud.verify import (
    VerifyResult,
    make_generator,
    mask_non_text,
    probs_from_logits,
    sample,
    verify_greedy,
    verify_sampling,
)

V = 8


def one_hot_logits(best: list[int], vocab: int = V) -> torch.Tensor:
    """Logits [n, vocab] whose row i has its unique maximum at best[i]."""
    logits = torch.zeros(len(best), vocab)
    for i, b in enumerate(best):
        logits[i, b] = 5.0
    return logits


# -- greedy ---------------------------------------------------------------------------


def test_greedy_all_right_with_bonus() -> None:
    logits = one_hot_logits([3, 1, 4, 6])
    assert verify_greedy(logits, [3, 1, 4]) == VerifyResult(accepted=3, tokens=[3, 1, 4, 6])


def test_greedy_all_right_no_bonus_row() -> None:
    # n == len(drafts): right after prefill one row checks the first hidden draft.
    logits = one_hot_logits([3, 1])
    assert verify_greedy(logits, [3, 1]) == VerifyResult(accepted=2, tokens=[3, 1])


def test_greedy_all_wrong_gives_correction() -> None:
    logits = one_hot_logits([3, 1, 4, 6])
    assert verify_greedy(logits, [0, 1, 4]) == VerifyResult(accepted=0, tokens=[3])


@pytest.mark.parametrize("j", [0, 1, 2, 3])
def test_greedy_wrong_at_position_j(j: int) -> None:
    best = [5, 2, 7, 0, 1]
    drafts = best[:4].copy()
    drafts[j] = (drafts[j] + 1) % V
    result = verify_greedy(one_hot_logits(best), drafts)
    assert result.accepted == j
    assert result.tokens == best[: j + 1]


def test_greedy_no_drafts_is_plain_decode() -> None:
    assert verify_greedy(one_hot_logits([4]), []) == VerifyResult(accepted=0, tokens=[4])


def test_greedy_ties_go_to_lowest_id() -> None:
    logits = torch.zeros(2, V)
    logits[:, 2] = logits[:, 5] = 1.0
    assert verify_greedy(logits, [5]) == VerifyResult(accepted=0, tokens=[2])
    assert verify_greedy(logits, [2]) == VerifyResult(accepted=1, tokens=[2, 2])


def test_greedy_length_errors() -> None:
    with pytest.raises(ValueError):
        verify_greedy(one_hot_logits([1, 2]), [1, 2, 3])
    with pytest.raises(ValueError):
        verify_greedy(torch.zeros(0, V), [])
    with pytest.raises(ValueError):
        verify_greedy(torch.zeros(V), [])
    with pytest.raises(ValueError):
        verify_greedy(one_hot_logits([1, 2]), [V])


def test_mask_non_text() -> None:
    logits = torch.arange(2 * V, dtype=torch.float32).view(2, V)
    masked = mask_non_text(logits, 5)
    assert torch.isneginf(masked[:, 5:]).all()
    assert torch.equal(masked[:, :5], logits[:, :5])
    assert not torch.isinf(logits).any()  # input untouched
    assert verify_greedy(masked, [4]).tokens == [4, 4]
    with pytest.raises(ValueError):
        mask_non_text(logits, V + 1)


# -- sampling -------------------------------------------------------------------------

P = torch.tensor([0.40, 0.25, 0.15, 0.12, 0.08])
# Chi-square critical value for 4 degrees of freedom at p = 1e-4 is 23.5; the
# generator is seeded, so the test is deterministic and the margin generous.
CHI2_LIMIT_DOF4 = 30.0


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def first_token_counts(draft: int, trials: int, seed: int, rows: int = 1) -> torch.Tensor:
    logits = P.log().expand(rows, -1).contiguous()  # [rows, 5]
    gen = make_generator(seed)
    counts = torch.zeros(len(P))
    for _ in range(trials):
        result = verify_sampling(logits, [draft], 1.0, 1.0, gen)
        counts[result.tokens[0]] += 1
    return counts


@pytest.mark.parametrize("draft", [0, 2, 4])
def test_sampling_first_token_distribution_matches_target(draft: int) -> None:
    counts = first_token_counts(draft, trials=6000, seed=1234 + draft)
    assert chi_square(counts, P) < CHI2_LIMIT_DOF4
    # The test has power: a verifier that always accepted the draft would fail it.
    always_accept = torch.zeros(len(P))
    always_accept[draft] = 6000
    assert chi_square(always_accept + 1e-9, P) > 100 * CHI2_LIMIT_DOF4


def test_sampling_bonus_token_distribution_matches_target() -> None:
    # Two rows, one draft: when accepted, the bonus comes from row 1 (also P here).
    logits = P.log().expand(2, -1).contiguous()
    gen = make_generator(7)
    counts = torch.zeros(len(P))
    for _ in range(6000):
        result = verify_sampling(logits, [0], 1.0, 1.0, gen)
        if result.accepted == 1:
            assert len(result.tokens) == 2
            counts[result.tokens[1]] += 1
        else:
            assert result.tokens[0] != 0 and len(result.tokens) == 1
    assert chi_square(counts, P) < CHI2_LIMIT_DOF4


def test_sampling_certain_draft_is_always_accepted() -> None:
    logits = torch.full((3, 5), float("-inf"))
    logits[:, 3] = 0.0  # p(3) == 1 on every row
    gen = make_generator(0)
    for _ in range(200):
        assert verify_sampling(logits, [3, 3], 0.7, 1.0, gen) == VerifyResult(2, [3, 3, 3])


def test_sampling_impossible_draft_is_always_rejected() -> None:
    logits = torch.tensor([[0.0, 0.0, float("-inf")]])
    gen = make_generator(0)
    for _ in range(100):
        result = verify_sampling(logits, [2], 1.0, 1.0, gen)
        assert result.accepted == 0 and result.tokens[0] in (0, 1)


def test_sampling_is_reproducible_from_seed() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    a = [verify_sampling(logits, [1, 2, 3], 0.8, 0.9, make_generator(99)) for _ in range(3)]
    assert a[0] == a[1] == a[2]


def test_probs_temperature_and_top_p() -> None:
    logits = P.log().unsqueeze(0)  # [1, 5]
    assert torch.allclose(probs_from_logits(logits, 1.0, 1.0)[0], P, atol=1e-6)
    sharp = probs_from_logits(logits, 0.5, 1.0)[0]
    assert torch.allclose(sharp, P**2 / (P**2).sum(), atol=1e-6)
    # top_p 0.6: 0.40 alone is short of 0.6, so 0.25 joins; the rest are cut.
    nucleus = probs_from_logits(logits, 1.0, 0.6)[0]
    assert torch.allclose(nucleus, torch.tensor([0.40, 0.25, 0, 0, 0]) / 0.65, atol=1e-6)
    # A tiny top_p still keeps the most probable id.
    assert probs_from_logits(logits, 1.0, 1e-6)[0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    for bad_t, bad_p in [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, 1.5)]:
        with pytest.raises(ValueError):
            probs_from_logits(logits, bad_t, bad_p)


def test_sampling_respects_top_p_on_rejection() -> None:
    # Draft 4 lies outside the 0.6-nucleus: always rejected, residual is the nucleus.
    logits = P.log().unsqueeze(0)
    gen = make_generator(5)
    counts = torch.zeros(len(P))
    for _ in range(2000):
        result = verify_sampling(logits, [4], 1.0, 0.6, gen)
        assert result.accepted == 0
        counts[result.tokens[0]] += 1
    assert counts[2:].sum() == 0
    assert math.isclose(float(counts[0] / counts.sum()), 0.40 / 0.65, abs_tol=0.04)


def test_sample_and_generator() -> None:
    gen = make_generator(-1)  # any int seeds a generator
    assert sample(torch.tensor([0.0, 0.0, 1.0]), gen) == 2
    a = [sample(P, make_generator(11)) for _ in range(5)]
    assert len(set(a)) == 1
