"""The reference HF engine (cloud/engine/hf.py) and lossless greedy speculation."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import DynamicCache

from cloud.engine.base import EngineState, TargetEngine
from cloud.engine.hf import HFEngine, crop_cache
from cloud.target import TargetModel
from cloud.verify import mask_non_text, verify_greedy
from shared.demoworld.tiny_target import build_tiny_random_target
from shared.errors import FailedPrecondition, InvalidInput

Proposer = Callable[[list[int], int], list[int]]


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


@pytest.fixture(scope="module")
def engine(target: TargetModel) -> HFEngine:
    return HFEngine(target)


def clip(seed: int) -> torch.Tensor:
    """Random normalised pixels [1, 8, 3, 32, 32]."""
    return torch.randn(1, 8, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def full_logits(target: TargetModel, ids: list[int], pix: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([ids]), pixel_values_videos=pix)
    logits: torch.Tensor = out.logits[0].float()  # [L, V]
    return logits


def test_engine_satisfies_protocol(engine: HFEngine) -> None:
    assert isinstance(engine, TargetEngine)


def test_prefill_and_steps_match_full_forward(target: TargetModel, engine: HFEngine) -> None:
    ids = target.build_prompt_ids("What is moving?")
    pix = clip(1)
    cont = [5, 77, 300, 12, 9]
    ref = full_logits(target, ids + cont, pix)  # [L + 5, V]
    n = len(ids)
    state, first = engine.prefill(ids, pixel_values_videos=pix)
    assert first.shape == (target.vocab_size,) and first.dtype == torch.float32
    assert engine.seq_len(state) == n
    torch.testing.assert_close(first, ref[n - 1], rtol=0, atol=1e-5)
    torch.testing.assert_close(engine.step(state, cont[:2]), ref[n : n + 2], rtol=0, atol=1e-5)
    torch.testing.assert_close(engine.step(state, cont[2:]), ref[n + 2 :], rtol=0, atol=1e-5)
    assert engine.seq_len(state) == n + 5


def test_rollback_then_restep_matches_fresh(target: TargetModel, engine: HFEngine) -> None:
    ids = target.build_prompt_ids("How many cars are there?")
    pix = clip(2)
    n = len(ids)
    state, _ = engine.prefill(ids, pixel_values_videos=pix)
    engine.step(state, [5, 77, 300])
    engine.rollback(state, n + 1)
    assert engine.seq_len(state) == n + 1
    again = engine.step(state, [99, 12])

    fresh, _ = engine.prefill(ids, pixel_values_videos=pix)
    want = engine.step(fresh, [5, 99, 12])[1:]
    torch.testing.assert_close(again, want, rtol=0, atol=1e-5)

    engine.rollback(state, engine.seq_len(state))  # no-op
    assert engine.seq_len(state) == n + 3
    with pytest.raises(InvalidInput):
        engine.rollback(state, n + 4)
    with pytest.raises(InvalidInput):
        engine.rollback(state, -1)
    engine.rollback(state, 0)
    assert engine.seq_len(state) == 0


def test_crop_cache_helper(target: TargetModel, engine: HFEngine) -> None:
    state, _ = engine.prefill(target.build_prompt_ids("Is it dark?"), pixel_values_videos=clip(3))
    cache = state.cache
    assert isinstance(cache, DynamicCache)
    length = cache.get_seq_length()
    crop_cache(cache, length)  # equal: no-op
    assert cache.get_seq_length() == length
    crop_cache(cache, length - 3)
    assert cache.get_seq_length() == length - 3
    for bad in (-1, length - 2):  # negative, or longer than what is cached
        with pytest.raises(InvalidInput):
            crop_cache(cache, bad)
    crop_cache(cache, 0)
    assert cache.get_seq_length() == 0


def test_engine_errors(target: TargetModel, engine: HFEngine) -> None:
    ids = target.build_prompt_ids("What is moving?")
    pix = clip(4)
    feats = target.video_features_from_pixels(pix)
    with pytest.raises(InvalidInput):
        engine.prefill(ids)
    with pytest.raises(InvalidInput):
        engine.prefill(ids, pixel_values_videos=pix, video_features=feats)
    with pytest.raises(InvalidInput):
        engine.prefill(ids[:-20] + ids[-19:], pixel_values_videos=pix)  # one placeholder short
    with pytest.raises(InvalidInput):
        engine.prefill([*ids, target.video_token_id - 1], pixel_values_videos=pix)  # <image>
    with pytest.raises(InvalidInput):
        engine.prefill(ids, pixel_values_videos=pix[:, :7])
    with pytest.raises(InvalidInput):
        engine.prefill(ids, video_features=feats[:, :, :16])
    state, _ = engine.prefill(ids, video_features=feats)
    with pytest.raises(InvalidInput):
        engine.step(state, [])
    with pytest.raises(InvalidInput):
        engine.step(state, [target.video_token_id])
    engine.release(state)
    engine.release(state)  # idempotent
    assert state.released
    with pytest.raises(FailedPrecondition):
        engine.step(state, [5])
    with pytest.raises(FailedPrecondition):
        engine.rollback(EngineState(cache=None, length=0), 0)


def test_feature_injection_matches_pixel_path(target: TargetModel, engine: HFEngine) -> None:
    ids = target.build_prompt_ids("Describe the scene.")
    pix = clip(5)
    feats = target.video_features_from_pixels(pix)  # [F, T, D], before the projector
    assert feats.shape == (8, 17, 32)
    s_pix, l_pix = engine.prefill(ids, pixel_values_videos=pix)
    s_feat, l_feat = engine.prefill(ids, video_features=feats)
    torch.testing.assert_close(l_feat, l_pix, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        engine.step(s_feat, [10, 20, 30]), engine.step(s_pix, [10, 20, 30]), rtol=0, atol=1e-6
    )
    # Different clips must change the answer's logits, or the test above proves nothing.
    _, other = engine.prefill(ids, video_features=target.video_features_from_pixels(clip(6)))
    assert not torch.allclose(other, l_pix, atol=1e-3)


# -- lossless greedy speculation ------------------------------------------------------


def reference_greedy(
    target: TargetModel, ids: list[int], pix: torch.Tensor, max_new: int, eos: int
) -> list[int]:
    """Target-only greedy decoding with HF ``generate``, non-text ids suppressed."""
    model: Any = target.model  # generate's self-type annotation confuses mypy
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            pixel_values_videos=pix,
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
            suppress_tokens=list(range(target.text_vocab_size, target.vocab_size)),
        )
    return [int(t) for t in out[0, len(ids) :]]


def speculative_greedy(
    engine: HFEngine,
    target: TargetModel,
    ids: list[int],
    visual: dict[str, torch.Tensor],
    propose: Proposer,
    k: int,
    max_new: int,
    eos: int,
) -> list[int]:
    """The cloud's greedy loop: hidden drafts after prefill, then verify k per step."""
    n = len(ids)
    state, first = engine.prefill(ids, **visual)  # first: [V]
    hidden = propose([], k)
    # One row after prefill checks the first hidden draft (n == len(drafts)).
    committed = verify_greedy(mask_non_text(first[None], target.text_vocab_size), hidden[:1]).tokens
    while len(committed) < max_new and eos not in committed:
        drafts = propose(committed, k)
        logits = engine.step(state, [committed[-1], *drafts])  # [k + 1, V]
        result = verify_greedy(mask_non_text(logits, target.text_vocab_size), drafts)
        assert result.tokens[: result.accepted] == drafts[: result.accepted]
        committed += result.tokens
        engine.rollback(state, n + len(committed) - 1)
        assert engine.seq_len(state) == n + len(committed) - 1
    engine.release(state)
    committed = committed[:max_new]
    return committed[: committed.index(eos) + 1] if eos in committed else committed


def proposers(ref: list[int], text_vocab: int, seed: int) -> dict[str, Proposer]:
    rng = random.Random(seed)

    def at(j: int) -> int:
        return ref[j] if j < len(ref) else 7

    def perfect(committed: list[int], k: int) -> list[int]:
        return [at(len(committed) + i) for i in range(k)]

    def all_wrong(committed: list[int], k: int) -> list[int]:
        return [(at(len(committed) + i) + 1) % text_vocab for i in range(k)]

    def mixed(committed: list[int], k: int) -> list[int]:
        return [
            at(len(committed) + i) if rng.random() < 0.7 else rng.randrange(text_vocab)
            for i in range(k)
        ]

    return {"perfect": perfect, "all_wrong": all_wrong, "mixed": mixed}


CASES = [
    (0, "What is moving?"),
    (1, "How many cars are there?"),
    (2, "Describe the scene."),
    (3, "Is the light red or green?"),
]


@pytest.mark.parametrize(("seed", "question"), CASES)
def test_speculative_greedy_equals_generate(seed: int, question: str) -> None:
    target = build_tiny_random_target(seed=seed)
    engine = HFEngine(target)
    ids = target.build_prompt_ids(question)
    pix = clip(100 + seed)
    max_new = 16
    ref = reference_greedy(target, ids, pix, max_new, target.eos_token_id)
    assert len(ref) >= 8
    for name, propose in proposers(ref, target.text_vocab_size, seed).items():
        for k in (0, 1, 4):
            got = speculative_greedy(
                engine,
                target,
                ids,
                {"pixel_values_videos": pix},
                propose,
                k,
                max_new,
                target.eos_token_id,
            )
            assert got == ref, (name, k)


def test_speculative_greedy_stops_at_eos_like_generate(
    target: TargetModel, engine: HFEngine
) -> None:
    ids = target.build_prompt_ids("What is moving?")
    pix = clip(7)
    free = reference_greedy(target, ids, pix, 16, target.eos_token_id)
    eos = free[5]  # pretend this id is EOS: generation must stop at its first occurrence
    ref = reference_greedy(target, ids, pix, 16, eos)
    assert ref[-1] == eos and len(ref) <= 6
    props = proposers(free, target.text_vocab_size, 0)
    for k in (0, 3, 8):
        got = speculative_greedy(
            engine, target, ids, {"pixel_values_videos": pix}, props["perfect"], k, 16, eos
        )
        assert got == ref


def test_outputs_depend_on_question_and_clip(target: TargetModel) -> None:
    """Guards the tiny model against degenerate, input-blind generations."""
    a = reference_greedy(target, target.build_prompt_ids("What is moving?"), clip(1), 8, 2)
    b = reference_greedy(target, target.build_prompt_ids("Is it dark?"), clip(1), 8, 2)
    c = reference_greedy(target, target.build_prompt_ids("What is moving?"), clip(2), 8, 2)
    assert a != b and a != c


def test_feature_path_generation_equals_pixel_path(target: TargetModel, engine: HFEngine) -> None:
    ids = target.build_prompt_ids("Where is the car going?")
    pix = clip(8)
    ref = reference_greedy(target, ids, pix, 12, target.eos_token_id)
    feats = target.video_features_from_pixels(pix)
    props = proposers(ref, target.text_vocab_size, 1)
    got = speculative_greedy(
        engine, target, ids, {"video_features": feats}, props["mixed"], 3, 12, target.eos_token_id
    )
    assert got == ref
