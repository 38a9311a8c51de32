"""The reference HF engine (cloud/engine/hf.py) and lossless greedy speculation."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput
from eventspec.shared.contract.types import DraftTail, GenerationSettings
from eventspec.shared.node.static.batch import StepBatch
from tests.support.alone import decode_alone

Proposer = Callable[[list[int], int], list[int]]


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


@pytest.fixture(scope="module")
def engine(target: TargetModel) -> HFEngine:
    return HFEngine(target, num_slots=4)


def clip(seed: int) -> torch.Tensor:
    """Random normalised pixels [1, 8, 3, 32, 32]."""
    return torch.randn(1, 8, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def full_logits(target: TargetModel, ids: list[int], pix: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([ids]), pixel_values_videos=pix)
    logits: torch.Tensor = out.logits[0].float()  # [L, V]
    return logits


def step(engine: HFEngine, slot: int, start: int, tokens: list[int]) -> torch.Tensor:
    """One session's step through the batched API -> logits [len(tokens), V]."""
    return engine.step(StepBatch((slot,), (start,), (len(tokens),), torch.tensor(tokens)))


def prefill(engine: HFEngine, slot: int, ids: list[int], **visual: torch.Tensor) -> torch.Tensor:
    return engine.prefill([PrefillRequest(slot, ids, **visual)])[0]  # [V]


def test_engine_reports_its_slots_and_context(engine: HFEngine) -> None:
    assert engine.num_slots == 4 and engine.max_seq_len == 4096


def test_prefill_and_steps_match_full_forward(target: TargetModel, engine: HFEngine) -> None:
    ids = target.build_prompt_ids("What is moving?")
    pix = clip(1)
    cont = [5, 77, 300, 12, 9]
    ref = full_logits(target, ids + cont, pix)  # [L + 5, V]
    n = len(ids)
    first = prefill(engine, 0, ids, pixel_values_videos=pix)
    assert first.shape == (target.vocab_size,) and first.dtype == torch.float32
    assert engine.cached_len(0) == n
    torch.testing.assert_close(first, ref[n - 1], rtol=0, atol=1e-5)
    torch.testing.assert_close(step(engine, 0, n, cont[:2]), ref[n : n + 2], rtol=0, atol=1e-5)
    torch.testing.assert_close(step(engine, 0, n + 2, cont[2:]), ref[n + 2 :], rtol=0, atol=1e-5)
    assert engine.cached_len(0) == n + 5


def test_start_position_rolls_back_implicitly(target: TargetModel, engine: HFEngine) -> None:
    ids = target.build_prompt_ids("How many cars are there?")
    pix = clip(2)
    n = len(ids)
    prefill(engine, 1, ids, pixel_values_videos=pix)
    step(engine, 1, n, [5, 77, 300])
    again = step(engine, 1, n + 1, [99, 12])  # 77 and 300 were rejected
    assert engine.cached_len(1) == n + 3

    prefill(engine, 2, ids, pixel_values_videos=pix)
    want = step(engine, 2, n, [5, 99, 12])[1:]
    torch.testing.assert_close(again, want, rtol=0, atol=1e-5)
    with pytest.raises(InvalidInput, match="start_positions"):
        step(engine, 1, n + 4, [1])  # beyond what the slot holds


def test_batched_step_equals_each_session_alone(target: TargetModel, engine: HFEngine) -> None:
    questions = ["What is moving?", "Is it dark?", "Describe the scene."]
    feeds = [[5], [7, 8, 9, 10], [11, 12]]
    lens, alone = [], []
    for slot, (q, feed) in enumerate(zip(questions, feeds, strict=True)):
        ids = target.build_prompt_ids(q)
        prefill(engine, slot, ids, pixel_values_videos=clip(20 + slot))
        lens.append(len(ids))
        alone.append(step(engine, slot, len(ids), feed))
    batch = StepBatch((0, 1, 2), tuple(lens), tuple(len(f) for f in feeds),
                      torch.tensor([t for f in feeds for t in f]))
    together = engine.step(batch)  # [7, V]
    torch.testing.assert_close(together, torch.cat(alone), rtol=0, atol=1e-5)


def test_engine_errors(target: TargetModel, engine: HFEngine) -> None:
    ids = target.build_prompt_ids("What is moving?")
    pix = clip(4)
    feats = target.video_features_from_pixels(pix)
    with pytest.raises(InvalidInput):
        prefill(engine, 0, ids)
    with pytest.raises(InvalidInput):
        prefill(engine, 0, ids, pixel_values_videos=pix, video_features=feats)
    with pytest.raises(InvalidInput):
        prefill(engine, 0, ids[:-20] + ids[-19:], pixel_values_videos=pix)  # one short
    with pytest.raises(InvalidInput):
        prefill(engine, 0, [*ids, target.video_token_id - 1], pixel_values_videos=pix)
    with pytest.raises(InvalidInput):
        prefill(engine, 0, ids, pixel_values_videos=pix[:, :7])
    with pytest.raises(InvalidInput):
        prefill(engine, 0, ids, video_features=feats[:, :, :16])
    with pytest.raises(InvalidInput, match="slot"):
        prefill(engine, 4, ids, video_features=feats)
    prefill(engine, 3, ids, video_features=feats)
    n = len(ids)
    with pytest.raises(InvalidInput, match="counts"):
        engine.step(StepBatch((3,), (n,), (0,), torch.tensor([], dtype=torch.long)))
    with pytest.raises(InvalidInput, match="text ids"):
        step(engine, 3, n, [target.video_token_id])
    with pytest.raises(InvalidInput, match="repeats"):
        engine.step(StepBatch((3, 3), (n, n), (1, 1), torch.tensor([5, 5])))
    with pytest.raises(InvalidInput, match="max_seq_len"):
        step(engine, 3, n, [5] * (engine.max_seq_len - n + 1))
    engine.free(3)
    engine.free(3)  # idempotent
    assert engine.cached_len(3) == 0
    with pytest.raises(FailedPrecondition):
        step(engine, 3, n, [5])


def test_feature_injection_matches_pixel_path(target: TargetModel, engine: HFEngine) -> None:
    ids = target.build_prompt_ids("Describe the scene.")
    pix = clip(5)
    feats = target.video_features_from_pixels(pix)  # [F, T, D], before the projector
    assert feats.shape == (8, 17, 32)
    l_pix = prefill(engine, 0, ids, pixel_values_videos=pix)
    l_feat = prefill(engine, 1, ids, video_features=feats)
    torch.testing.assert_close(l_feat, l_pix, rtol=0, atol=1e-6)
    n = len(ids)
    torch.testing.assert_close(
        step(engine, 1, n, [10, 20, 30]), step(engine, 0, n, [10, 20, 30]), rtol=0, atol=1e-6
    )
    # Different clips must change the answer's logits, or the test above proves nothing.
    other = prefill(engine, 2, ids, video_features=target.video_features_from_pixels(clip(6)))
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
    """The cloud's greedy loop alone: hidden drafts before prefill, then k per step."""
    session = DecodingSession(
        settings=GenerationSettings(max_new_tokens=max_new), slot=0, prompt_len=len(ids),
        max_seq_len=engine.max_seq_len, eos_token_id=eos, max_verify_tokens=k + 1,
        decode=lambda _ids: "", speculative=True,
    )

    def tail(committed: Sequence[int]) -> DraftTail | None:
        drafts = propose(list(committed), k)
        return DraftTail(len(committed), tuple(drafts)) if drafts else None

    decode_alone(engine, session, ids, **visual, text_vocab_size=target.text_vocab_size,
                 propose=tail)
    assert engine.cached_len(0) == 0  # the slot was freed
    return session.committed


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
    engine = HFEngine(target, num_slots=1)
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
