"""The static-KV engine (cloud/engine/static/engine.py) against the HF reference, on CPU.

The reference is the HF model's own forward over a ``DynamicCache`` per session,
cropped to each step's start (what a rejected draft does). Greedy fp32 on the tiny
and the toy targets: logits agree to float32 rounding and the greedy tokens are
identical, alone and batched, across different prompt lengths, per-session counts,
rolled-back starts, reused slots, and the pixel and aligned-feature prefills.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.build import (
    build_static_engine,
    kv_bytes_per_slot,
    static_kv_plan,
)
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.engine.static.weights import static_unsupported_reason
from eventspec.cloud.target import TargetModel, load_target
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.kvcache import cache_kwarg, crop_cache
from eventspec.shared.node.static.attention import num_splits_for, reference_attention
from eventspec.shared.node.static.batch import StepBatch

TOY_DIR = Path(__file__).resolve().parents[3] / "cloud" / "models" / "toy-video-llava"
QUESTIONS = (
    "What is moving?",
    "How many cars cross the road from the left side of the scene?",
    "Is it day or night?",
    "Describe the scene in one short sentence please.",
)
ATOL = 2e-4


class HFSession:
    """One session on the HF model: prefill, then steps from a (possibly earlier) start."""

    def __init__(self, target: TargetModel, ids: list[int], pix: torch.Tensor) -> None:
        self.model = target.model
        self.cache = DynamicCache(config=target.model.config)
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.tensor([ids]),
                pixel_values_videos=pix,
                **{cache_kwarg(self.model): self.cache},
                use_cache=True,
            )
        self.first: torch.Tensor = out.logits[0, -1].float()  # [V]

    def step(self, start: int, tokens: list[int]) -> torch.Tensor:
        crop_cache(self.cache, start)
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([tokens]),
                             **{cache_kwarg(self.model): self.cache})
        logits: torch.Tensor = out.logits[0].float()  # [k, V]
        return logits


def clip(target: TargetModel, seed: int) -> torch.Tensor:
    g = target.geometry
    shape = (1, g.num_frames, 3, g.image_size, g.image_size)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))  # [1, F, 3, S, S]


def engine_for(target: TargetModel, slots: int = 4) -> StaticEngine:
    kv = static_kv_plan(target, kv_cache_bytes=None, max_seq_len=256, max_slots=slots)
    return build_static_engine(target, kv, use_graphs=False)


@pytest.fixture(scope="module")
def tiny() -> TargetModel:
    return build_tiny_random_target(seed=0)


@pytest.fixture(scope="module")
def toy() -> TargetModel:
    return load_target(TOY_DIR)


@pytest.fixture(scope="module")
def tiny_engine(tiny: TargetModel) -> StaticEngine:
    return engine_for(tiny)


def run_speculative(
    target: TargetModel,
    engine: StaticEngine,
    slots: list[int],
    questions: list[str],
    rounds: int,
    seed: int,
    max_count: int = 5,
) -> list[list[int]]:
    """Greedy speculative decoding of several sessions, checked row by row against HF.

    Each round steps a random subset of the sessions together, each with its last
    committed token plus 0..max_count-1 random drafts; a random number of drafts is
    accepted, so the next start rolls back over the rejected ones. Returns each
    session's committed tokens.
    """
    rng = random.Random(seed)
    vocab = target.text_vocab_size
    ids = [target.build_prompt_ids(q) for q in questions]
    pixels = [clip(target, QUESTIONS.index(q)) for q in questions]  # a clip per question
    refs = [HFSession(target, i, p) for i, p in zip(ids, pixels, strict=True)]
    reqs = [
        PrefillRequest(slot=s, input_ids=i, pixel_values_videos=p)
        for s, i, p in zip(slots, ids, pixels, strict=True)
    ]
    first = engine.prefill(reqs)  # [R, V]
    assert first.shape == (len(slots), target.vocab_size) and first.dtype == torch.float32
    for row, ref in zip(first, refs, strict=True):
        torch.testing.assert_close(row, ref.first, rtol=0, atol=ATOL)
    lengths = [len(i) for i in ids]
    nxt = [int(r.first[:vocab].argmax()) for r in refs]
    committed: list[list[int]] = [[n] for n in nxt]
    for _ in range(rounds):
        chosen = sorted(rng.sample(range(len(slots)), rng.randint(1, len(slots))))
        toks = [[nxt[i]] + [rng.randrange(vocab) for _ in range(rng.randrange(max_count))]
                for i in chosen]  # fmt: skip
        if rng.random() < 0.5:  # sometimes the drafts are the right ones
            for i, t in zip(chosen, toks, strict=True):
                t[1:] = greedy_chain(refs[i], lengths[i], t[0], len(t) - 1, vocab)
        batch = StepBatch(
            slots=tuple(slots[i] for i in chosen),
            start_positions=tuple(lengths[i] for i in chosen),
            counts=tuple(len(t) for t in toks),
            token_ids=torch.tensor([x for t in toks for x in t]),
        )
        out = engine.step(batch)  # [N, V]
        assert out.shape == (batch.num_tokens, target.vocab_size)
        at = 0
        for i, t in zip(chosen, toks, strict=True):
            got = out[at : at + len(t)]  # [k, V]
            at += len(t)
            want = refs[i].step(lengths[i], t)  # [k, V]
            torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
            greedy = got[:, :vocab].argmax(-1).tolist()
            assert greedy == want[:, :vocab].argmax(-1).tolist()
            accepted = 0
            while accepted < len(t) - 1 and t[accepted + 1] == greedy[accepted]:
                accepted += 1
            accepted = min(accepted, rng.randint(0, len(t) - 1)) if rng.random() < 0.3 else accepted
            lengths[i] += 1 + accepted
            committed[i] += [*t[1 : accepted + 1], greedy[accepted]]
            nxt[i] = greedy[accepted]
    return committed


def greedy_chain(ref: HFSession, start: int, token: int, n: int, vocab: int) -> list[int]:
    """The n tokens greedy decoding would produce after ``token`` (HF, then rolled back)."""
    chain: list[int] = []
    pos, cur = start, token
    for _ in range(n):
        cur = int(ref.step(pos, [cur])[0, :vocab].argmax())
        pos += 1
        chain.append(cur)
    crop_cache(ref.cache, start)
    return chain


def test_engine_reports_its_slots_and_context(tiny_engine: StaticEngine) -> None:
    assert tiny_engine.num_slots == 4 and tiny_engine.max_seq_len == 256


def test_supported_models(tiny: TargetModel, toy: TargetModel) -> None:
    assert static_unsupported_reason(tiny) is None
    assert static_unsupported_reason(toy) is None


def test_unsupported_model_has_a_reason() -> None:
    odd = build_tiny_random_target(seed=1)
    odd.model.model.language_model.config.hidden_act = "gelu"
    reason = static_unsupported_reason(odd)
    assert reason is not None and "gelu" in reason
    with pytest.raises(InvalidInput, match="gelu"):
        engine_for(odd)


def test_slots_follow_the_byte_budget(tiny: TargetModel) -> None:
    per_slot = kv_bytes_per_slot(tiny, 128)
    kv = static_kv_plan(tiny, kv_cache_bytes=5 * per_slot + 7, max_seq_len=128)
    assert (kv.num_slots, kv.scratch_slots) == (4, 1)  # one of the five is the padding slot
    engine = build_static_engine(tiny, kv, use_graphs=False)
    assert engine.num_slots == 4
    assert engine.k_cache.shape[1] == 5
    with pytest.raises(InvalidInput, match="holds no slot"):
        static_kv_plan(tiny, kv_cache_bytes=per_slot, max_seq_len=128)
    with pytest.raises(InvalidInput, match="scratch KV slot"):
        build_static_engine(tiny, dataclasses.replace(kv, scratch_slots=0), use_graphs=False)


def test_single_session_matches_hf(tiny: TargetModel, tiny_engine: StaticEngine) -> None:
    run_speculative(tiny, tiny_engine, [2], [QUESTIONS[0]], rounds=6, seed=1)


def test_batched_sessions_match_hf(tiny: TargetModel, tiny_engine: StaticEngine) -> None:
    run_speculative(tiny, tiny_engine, [0, 1, 3], list(QUESTIONS[:3]), rounds=8, seed=2)


def test_batched_equals_alone(tiny: TargetModel, tiny_engine: StaticEngine) -> None:
    """The same schedule gives the same tokens whether sessions step together or alone."""
    together = run_speculative(tiny, tiny_engine, [0, 1], list(QUESTIONS[1:3]), 5, seed=3)
    alone = [run_speculative(tiny, tiny_engine, [3], [q], 5, seed=3)[0] for q in QUESTIONS[1:3]]
    for a, b in zip(together, alone, strict=True):
        n = min(len(a), len(b))
        assert a[:n] == b[:n]


def test_toy_target_matches_hf(toy: TargetModel) -> None:
    engine = engine_for(toy, slots=3)
    run_speculative(toy, engine, [0, 1, 2], list(QUESTIONS[1:4]), rounds=8, seed=4, max_count=9)


def test_reused_slot_and_aligned_features(tiny: TargetModel, tiny_engine: StaticEngine) -> None:
    """A freed slot prefilled from tower features equals a fresh pixel-path session."""
    run_speculative(tiny, tiny_engine, [1], [QUESTIONS[3]], rounds=2, seed=5)
    tiny_engine.free(1)
    tiny_engine.free(1)  # idempotent
    ids = tiny.build_prompt_ids(QUESTIONS[2])
    pix = clip(tiny, 77)
    feats = tiny.video_features_from_pixels(pix)  # [F, T, Dv]
    first = tiny_engine.prefill([PrefillRequest(slot=1, input_ids=ids, video_features=feats)])
    ref = HFSession(tiny, ids, pix)
    torch.testing.assert_close(first[0], ref.first, rtol=0, atol=ATOL)
    tok = int(ref.first[: tiny.text_vocab_size].argmax())
    for _ in range(4):
        batch = StepBatch((1,), (len(ids),), (1,), torch.tensor([tok]))
        got = tiny_engine.step(batch)  # [1, V]
        want = ref.step(len(ids), [tok])  # [1, V]
        torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
        ids.append(tok)
        tok = int(got[0, : tiny.text_vocab_size].argmax())


def test_step_rejects_bad_batches(tiny: TargetModel) -> None:
    engine = engine_for(tiny, slots=2)
    ids = tiny.build_prompt_ids(QUESTIONS[0])
    with pytest.raises(InvalidInput, match="no prefilled"):
        engine.step(StepBatch((0,), (len(ids),), (1,), torch.tensor([5])))
    engine.prefill([PrefillRequest(slot=0, input_ids=ids, pixel_values_videos=clip(tiny, 0))])
    with pytest.raises(InvalidInput, match="outside"):
        engine.step(StepBatch((0,), (255,), (2,), torch.tensor([5, 6])))
    with pytest.raises(InvalidInput, match="twice"):
        engine.step(StepBatch((0, 0), (len(ids), len(ids)), (1, 1), torch.tensor([5, 6])))
    with pytest.raises(InvalidInput, match="exactly one"):
        engine.prefill([PrefillRequest(slot=1, input_ids=ids)])
    with pytest.raises(InvalidInput, match="outside"):
        engine.free(2)


def test_splits_fill_the_gpu() -> None:
    assert num_splits_for(1, 32, 132) == 16
    assert num_splits_for(16, 32, 132) == 2
    assert num_splits_for(64, 32, 132) == 1


def test_reference_attention_reads_only_the_live_prefix() -> None:
    """Garbage beyond each session's length (rejected drafts) never changes the output."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 8, generator=gen)  # [Bp, Q, H, D]
    k = torch.randn(3, 2, 16, 8, generator=gen)  # [S, Hkv, T, D]
    v = torch.randn(3, 2, 16, 8, generator=gen)
    slots, starts, lens = torch.tensor([2, 0]), torch.tensor([5, 9]), torch.tensor([8, 12])
    out = reference_attention(q, k, v, slots, starts, lens)  # [Bp, Q, H, D]
    k2, v2 = k.clone(), v.clone()
    k2[2, :, 8:] = 1e3
    v2[0, :, 12:] = -1e3
    torch.testing.assert_close(reference_attention(q, k2, v2, slots, starts, lens), out)


@pytest.mark.gpu
def test_splitkv_kernel_matches_reference() -> None:
    """The Triton split-KV kernel against dense masked attention, bf16 on CUDA."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from eventspec.shared.node.static.attention import splitkv_attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    for bp, nq, splits in ((1, 1, 16), (4, 9, 4), (3, 33, 2), (8, 16, 1)):
        q = torch.randn(bp, nq, 32, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
        k = torch.randn(9, 32, 2304, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
        v = torch.randn(9, 32, 2304, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
        slots = torch.randperm(9, device="cuda")[:bp]
        starts = torch.randint(1, 2200, (bp,), device="cuda")
        lens = starts + nq
        ref = reference_attention(q.float(), k.float(), v.float(), slots, starts, lens)
        out = splitkv_attention(q, k, v, slots, starts, lens, num_splits=splits)
        err = (out.float() - ref).norm() / ref.norm()
        assert err < 1e-2, (bp, nq, splits, float(err))


@pytest.mark.gpu
def test_fused_kernels_match_torch() -> None:
    """RoPE + KV write and SiLU-mul (Triton) against the CPU path's torch functions."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from eventspec.shared.node.static.kernels import rms_norm, rope_and_write_kv, silu_mul
    from eventspec.shared.node.static.layers import rms_norm as rms_norm_ref
    from eventspec.shared.node.static.layers import rotate

    gen = torch.Generator(device="cuda").manual_seed(0)
    m, hq, hkv, d = 37, 32, 32, 128
    qkv = torch.randn(m, (hq + 2 * hkv) * d, device="cuda", generator=gen)
    cos = torch.randn(m, d, device="cuda", generator=gen)
    sin = torch.randn(m, d, device="cuda", generator=gen)
    kc = torch.zeros(3, hkv, 64, d, device="cuda")
    vc = torch.zeros(3, hkv, 64, d, device="cuda")
    ws = torch.randint(0, 3, (m,), device="cuda", generator=gen)
    wp = torch.randperm(64, device="cuda", generator=gen)[:m]
    q = rope_and_write_kv(qkv, cos, sin, kc, vc, ws, wp, hq, hkv)  # [M, Hq, D]
    torch.testing.assert_close(q, rotate(qkv[:, : hq * d].view(m, hq, d), cos, sin))
    k_ref = rotate(qkv[:, hq * d : (hq + hkv) * d].view(m, hkv, d), cos, sin)
    torch.testing.assert_close(kc[ws, :, wp], k_ref)
    torch.testing.assert_close(vc[ws, :, wp], qkv[:, (hq + hkv) * d :].view(m, hkv, d))
    gu = torch.randn(m, 2 * 11008, device="cuda", generator=gen, dtype=torch.bfloat16)
    ref = torch.nn.functional.silu(gu[:, :11008]) * gu[:, 11008:]
    torch.testing.assert_close(silu_mul(gu), ref)
    x = torch.randn(m, 4096, device="cuda", generator=gen, dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", generator=gen, dtype=torch.bfloat16)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5))


def test_one_bad_request_fails_a_batched_prefill_before_any_model_work(tiny: TargetModel) -> None:
    engine = engine_for(tiny, slots=3)
    good = PrefillRequest(slot=0, input_ids=tiny.build_prompt_ids(QUESTIONS[0]),
                          pixel_values_videos=clip(tiny, 0))
    no_video = PrefillRequest(slot=1, input_ids=[1, 2, 3], pixel_values_videos=clip(tiny, 1))
    with pytest.raises(InvalidInput, match="placeholders"):
        engine.prefill([good, no_video])
    with pytest.raises(InvalidInput, match="slot twice"):
        engine.prefill([good, good])
    with pytest.raises(InvalidInput, match="does not fit"):
        engine.prefill([good, PrefillRequest(slot=2, input_ids=[1] * 300,
                                             pixel_values_videos=clip(tiny, 2))])
    with pytest.raises(InvalidInput, match="no prefilled session"):  # nothing became live
        engine.step(StepBatch((0,), (5,), (1,), torch.tensor([1])))


def test_padded_tokens_are_what_a_step_pays_per_session(tiny_engine: StaticEngine,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager steps pad every session to the longest; graph steps to its bucket (the
    verify-width rule prices steps by this)."""
    assert tiny_engine.padded_tokens(4) == 4
    monkeypatch.setattr(tiny_engine, "use_graphs", True)
    assert [tiny_engine.padded_tokens(q) for q in (1, 4, 6, 40)] == [1, 5, 9, 40]
