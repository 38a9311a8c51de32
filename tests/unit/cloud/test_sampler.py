"""The batched sampler (cloud/scheduling/sampler.py): greedy acceptance and rejection sampling."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest
import torch

from eventspec.cloud.scheduling.sampler import BatchedSampler, SampleSpec, Verdict, make_generator
from eventspec.shared.contract.errors import InvalidInput
from tests.support.sampling import target_probs

V = 8


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny tensors on a shared 2-core machine: intra-op threads only add contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def one_hot_logits(best: list[int], vocab: int = V) -> torch.Tensor:
    """Logits [n, vocab] whose row i has its unique maximum at best[i]."""
    logits = torch.zeros(len(best), vocab)
    for i, b in enumerate(best):
        logits[i, b] = 5.0
    return logits


def greedy(logits: torch.Tensor, drafts: list[int], text_vocab: int = V) -> Verdict:
    return BatchedSampler(text_vocab)(logits, [SampleSpec(logits.shape[0], drafts)])[0]


def sampled(logits: torch.Tensor, drafts: list[int], t: float, top_p: float,
            gen: torch.Generator) -> Verdict:
    spec = SampleSpec(logits.shape[0], drafts, t, top_p, gen)
    return BatchedSampler(logits.shape[1])(logits, [spec])[0]


# -- greedy ---------------------------------------------------------------------------


def test_greedy_all_right_with_bonus() -> None:
    assert greedy(one_hot_logits([3, 1, 4, 6]), [3, 1, 4]) == Verdict(3, [3, 1, 4, 6])


def test_greedy_all_right_no_bonus_row() -> None:
    # rows == len(drafts): right after prefill one row checks the first hidden draft.
    assert greedy(one_hot_logits([3, 1]), [3, 1]) == Verdict(2, [3, 1])


def test_greedy_all_wrong_gives_correction() -> None:
    assert greedy(one_hot_logits([3, 1, 4, 6]), [0, 1, 4]) == Verdict(0, [3])


@pytest.mark.parametrize("j", [0, 1, 2, 3])
def test_greedy_wrong_at_position_j(j: int) -> None:
    best = [5, 2, 7, 0, 1]
    drafts = best[:4].copy()
    drafts[j] = (drafts[j] + 1) % V
    result = greedy(one_hot_logits(best), drafts)
    assert result.accepted == j
    assert result.tokens == best[: j + 1]


def test_greedy_no_drafts_is_plain_decode() -> None:
    assert greedy(one_hot_logits([4]), []) == Verdict(0, [4])


def test_greedy_ties_go_to_lowest_id() -> None:
    logits = torch.zeros(2, V)
    logits[:, 2] = logits[:, 5] = 1.0
    assert greedy(logits, [5]) == Verdict(0, [2])
    assert greedy(logits, [2]) == Verdict(1, [2, 2])


def test_non_text_ids_never_win() -> None:
    logits = torch.arange(2 * V, dtype=torch.float32).view(2, V)  # the max is the last id
    assert greedy(logits, [4], text_vocab=5) == Verdict(1, [4, 4])
    gen = make_generator(0)
    for _ in range(50):
        out = sampled(logits, [], 1.0, 1.0, gen)
        assert out.tokens[0] < V
    spec = SampleSpec(2, [], 1.0, 1.0, gen)
    assert all(BatchedSampler(5)(logits, [spec])[0].tokens[0] < 5 for _ in range(50))


def test_shape_and_spec_errors_name_the_problem() -> None:
    s = BatchedSampler(V)
    with pytest.raises(InvalidInput, match="rows"):
        s(one_hot_logits([1, 2]), [SampleSpec(2, [1, 2, 3])])
    with pytest.raises(InvalidInput, match="cover"):
        s(one_hot_logits([1, 2]), [SampleSpec(1, [])])
    with pytest.raises(InvalidInput, match=r"\[N, V"):
        s(torch.zeros(V), [SampleSpec(1, [])])
    with pytest.raises(InvalidInput, match="text ids"):
        s(one_hot_logits([1, 2]), [SampleSpec(2, [V])])
    with pytest.raises(InvalidInput, match="generator"):
        s(one_hot_logits([1]), [SampleSpec(1, [], 0.5)])


def test_greedy_mixed_batch_equals_each_alone() -> None:
    rng = random.Random(3)
    specs, blocks = [], []
    for _ in range(12):
        rows = rng.randint(1, 6)
        block = torch.randn(rows, V, generator=torch.Generator().manual_seed(rng.randrange(99)))
        best = block.argmax(-1).tolist()
        n = rng.randint(0, rows)
        drafts = [b if rng.random() < 0.7 else (b + 1) % V for b in best[:n]]
        specs.append(SampleSpec(rows, drafts))
        blocks.append(block)
    together = BatchedSampler(V)(torch.cat(blocks), specs)
    alone = [BatchedSampler(V)(b, [s])[0] for b, s in zip(blocks, specs, strict=True)]
    assert together == alone


def test_a_launched_call_gives_the_calls_verdicts_in_the_specs_order() -> None:
    """``launch`` then ``result`` (the engine loop's way) equals the plain call, on a
    batch that interleaves greedy and sampled sessions (two parts, merged back)."""
    rng = random.Random(5)
    specs, blocks = [], []
    for i in range(9):
        rows = rng.randint(1, 4)
        blocks.append(torch.randn(rows, V, generator=torch.Generator().manual_seed(i)))
        drafts = [rng.randrange(V) for _ in range(rng.randint(0, rows))]
        t = 0.0 if i % 3 else 0.8
        specs.append(SampleSpec(rows, drafts, t, 0.9, make_generator(i) if t else None))
    logits = torch.cat(blocks)
    launched = BatchedSampler(V).launch(logits, specs).result()
    for s in specs:  # the same draws again
        if s.generator is not None:
            s.generator.manual_seed(specs.index(s))
    assert launched == BatchedSampler(V)(logits, specs)
    greedy_alone = [BatchedSampler(V)(b, [s])[0] for b, s in zip(blocks, specs, strict=True)
                    if s.temperature == 0]
    assert [v for v, s in zip(launched, specs, strict=True) if s.temperature == 0] == greedy_alone


def test_a_launch_checks_the_specs_before_any_work() -> None:
    gen = make_generator(0)
    before = gen.get_state()
    with pytest.raises(InvalidInput, match="text ids"):
        BatchedSampler(V).launch(one_hot_logits([1, 2, 3]),
                                 [SampleSpec(1, [], 0.7, 1.0, gen), SampleSpec(2, [V])])
    assert torch.equal(gen.get_state(), before)  # nothing was drawn


# -- sampling -------------------------------------------------------------------------

P = torch.tensor([0.40, 0.25, 0.15, 0.12, 0.08])
# Chi-square critical value for 4 degrees of freedom at p = 1e-4 is 23.5; the
# generator is seeded, so the test is deterministic and the margin generous.
CHI2_LIMIT_DOF4 = 30.0
TRIALS = 2500


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("draft", [0, 2, 4])
def test_sampling_first_token_distribution_matches_target_in_a_mixed_batch(draft: int) -> None:
    """Each trial runs the session under test between a greedy session and another
    sampling session; the others must not bend its distribution."""
    sampler = BatchedSampler(len(P))
    gen, other_gen = make_generator(1234 + draft), make_generator(77)
    logits = torch.cat([torch.randn(3, len(P)), P.log().unsqueeze(0), torch.randn(2, len(P))])
    specs = [SampleSpec(3, [1, 2]), SampleSpec(1, [draft], 1.0, 1.0, gen),
             SampleSpec(2, [3], 0.7, 0.9, other_gen)]
    counts = torch.zeros(len(P))
    for _ in range(TRIALS):
        counts[sampler(logits, specs)[1].tokens[0]] += 1
    assert chi_square(counts, P) < CHI2_LIMIT_DOF4
    # The test has power: a verifier that always accepted the draft would fail it.
    always_accept = torch.zeros(len(P))
    always_accept[draft] = TRIALS
    assert chi_square(always_accept + 1e-9, P) > 100 * CHI2_LIMIT_DOF4


def test_sampling_bonus_token_distribution_matches_target() -> None:
    # Two rows, one draft: when accepted, the bonus comes from row 1 (also P here).
    logits = P.log().expand(2, -1).contiguous()
    gen = make_generator(7)
    counts = torch.zeros(len(P))
    for _ in range(TRIALS):
        result = sampled(logits, [0], 1.0, 1.0, gen)
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
        assert sampled(logits, [3, 3], 0.7, 1.0, gen) == Verdict(2, [3, 3, 3])


def test_sampling_impossible_draft_is_always_rejected() -> None:
    logits = torch.tensor([[0.0, 0.0, float("-inf")]])
    gen = make_generator(0)
    for _ in range(100):
        result = sampled(logits, [2], 1.0, 1.0, gen)
        assert result.accepted == 0 and result.tokens[0] in (0, 1)


def test_sampling_is_reproducible_from_seed_whatever_the_batch() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    alone = [sampled(logits, [1, 2, 3], 0.8, 0.9, make_generator(99)) for _ in range(3)]
    assert alone[0] == alone[1] == alone[2]
    noise = torch.randn(5, 50)
    for _ in range(3):
        specs = [SampleSpec(2, [4], 1.3, 1.0, make_generator(5)), SampleSpec(3, [])]
        specs.insert(1, SampleSpec(4, [1, 2, 3], 0.8, 0.9, make_generator(99)))
        mixed = BatchedSampler(50)(torch.cat([noise[:2], logits, noise[2:]]), specs)
        assert mixed[1] == alone[0]


def test_target_probs_temperature_and_top_p() -> None:
    logits = P.log().unsqueeze(0)  # [1, 5]
    assert torch.allclose(target_probs(logits, 1.0, 1.0)[0], P, atol=1e-6)
    sharp = target_probs(logits, 0.5, 1.0)[0]
    assert torch.allclose(sharp, P**2 / (P**2).sum(), atol=1e-6)
    # top_p 0.6: 0.40 alone is short of 0.6, so 0.25 joins; the rest are cut.
    nucleus = target_probs(logits, 1.0, 0.6)[0]
    assert torch.allclose(nucleus, torch.tensor([0.40, 0.25, 0, 0, 0]) / 0.65, atol=1e-6)
    # A tiny top_p still keeps the most probable id.
    assert target_probs(logits, 1.0, 1e-6)[0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    for bad_t, bad_p in [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, 1.5)]:
        with pytest.raises(InvalidInput):
            target_probs(logits, bad_t, bad_p)


def test_sampling_respects_top_p_on_rejection() -> None:
    # Draft 4 lies outside the 0.6-nucleus: always rejected, residual is the nucleus.
    logits = P.log().unsqueeze(0)
    gen = make_generator(5)
    counts = torch.zeros(len(P))
    for _ in range(2000):
        result = sampled(logits, [4], 1.0, 0.6, gen)
        assert result.accepted == 0
        counts[result.tokens[0]] += 1
    assert counts[2:].sum() == 0
    assert math.isclose(float(counts[0] / counts.sum()), 0.40 / 0.65, abs_tol=0.04)


def test_generator_accepts_any_int_seed() -> None:
    a = [sampled(P.log().unsqueeze(0), [], 1.0, 1.0, make_generator(-1)) for _ in range(5)]
    assert len({tuple(v.tokens) for v in a}) == 1
