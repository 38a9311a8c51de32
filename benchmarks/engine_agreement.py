"""Does the static engine give the tokens it should (``benchmarks/bench_engine.py``): the
same session's logits alone and beside others (batch invariance), and its greedy tokens
against HF eager over the same inputs."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.target import TargetModel
from eventspec.shared.node.static.batch import StepBatch

QUESTION = "What is moving in the scene, and which way does it go?"


def pixels(target: TargetModel, seed: int) -> torch.Tensor:
    g = target.geometry
    gen = torch.Generator().manual_seed(seed)
    pix = torch.randn(1, g.num_frames, 3, g.image_size, g.image_size, generator=gen)
    return pix.to(target.device, target.dtype)  # [1, F, 3, S, S]


def batch_invariance(
    engine: StaticEngine, target: TargetModel, n_tokens: int, companions: tuple[int, ...]
) -> dict[str, float]:
    """Session 0's greedy argmax and logits when it steps alone vs beside others.

    The same teacher-forced tokens through slot 0, with k = 0 and k = 8 steps, alone
    and in batches of 1 + c sessions (the others step their own random tokens): the
    share of equal argmaxes, whether the logits are bitwise equal and their largest
    difference; and whether k = 8 steps give single-token steps' bits. bf16 GEMMs pick
    different kernels for different row counts unless the engine is batch-invariant.
    """
    ids = target.build_prompt_ids(QUESTION)
    pix = pixels(target, 1)
    gen = torch.Generator().manual_seed(3)
    cont = torch.randint(5, target.text_vocab_size, (n_tokens,), generator=gen).tolist()
    vocab = target.text_vocab_size
    ctx = len(ids)

    def run(chunk: int, others: int) -> torch.Tensor:
        """Session 0's [n + 1, V] logits (the prefill's first, then every step's rows)."""
        first = engine.prefill([PrefillRequest(slot=0, input_ids=ids, pixel_values_videos=pix)])
        rows = [first[0, :vocab]]
        at = 0
        while at < n_tokens:
            q = min(chunk, n_tokens - at)
            toks = torch.tensor(cont[at : at + q], device=engine.device)
            noise = torch.randint(5, vocab, (others * q,), device=engine.device)
            batch = StepBatch(
                slots=(0, *range(1, others + 1)),
                start_positions=(ctx + at,) + (ctx,) * others,
                counts=(q,) * (others + 1),
                token_ids=torch.cat([toks, noise]),
            )
            rows.extend(engine.step(batch)[:q, :vocab])
            at += q
        return torch.stack(rows)  # [n + 1, V]

    out: dict[str, float] = {"tokens": float(n_tokens + 1),
                             "batch_invariant": float(engine.batch_invariant)}
    single = run(1, 0)
    for chunk in (1, 9):
        alone = run(chunk, 0)
        # k = 8 steps against single-token steps: the verify step's own invariance.
        out[f"k{chunk - 1}_vs_single_steps_bitwise"] = float(torch.equal(alone, single))
        for c in companions:
            together = run(chunk, c)
            out[f"k{chunk - 1}_alone_vs_B{c + 1}"] = float(
                (together.argmax(-1) == alone.argmax(-1)).float().mean())
            out[f"k{chunk - 1}_alone_vs_B{c + 1}_bitwise"] = float(torch.equal(together, alone))
            out[f"k{chunk - 1}_alone_vs_B{c + 1}_max_abs_diff"] = float(
                (together.float() - alone.float()).abs().max())
    return out


def agreement(engine: StaticEngine, target: TargetModel, n_tokens: int) -> dict[str, float]:
    """Greedy agreement with HF eager over the same inputs (teacher-forced), and the
    engine's single-token steps against its 9-token steps over the same positions."""
    ids = target.build_prompt_ids(QUESTION)
    pix = pixels(target, 1)
    gen = torch.Generator().manual_seed(2)
    cont = torch.randint(5, target.text_vocab_size, (n_tokens,), generator=gen).tolist()
    vocab = target.text_vocab_size
    with torch.inference_mode():
        full = target.model(input_ids=torch.tensor([ids + cont], device=target.device),
                            pixel_values_videos=pix).logits[0, len(ids) - 1 :]  # fmt: skip
    hf_greedy = full[:, :vocab].float().argmax(-1)  # [n + 1]

    def run(chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = engine.prefill([PrefillRequest(slot=0, input_ids=ids, pixel_values_videos=pix)])
        rows = [first[0]]
        at = 0
        while at < n_tokens:
            q = min(chunk, n_tokens - at)
            toks = torch.tensor(cont[at : at + q], device=engine.device)
            rows.extend(engine.step(StepBatch((0,), (len(ids) + at,), (q,), toks)))
            at += q
        logits = torch.stack(rows)  # [n + 1, V]
        return logits[:, :vocab].argmax(-1), logits

    single, single_logits = run(1)
    chunked, _ = run(9)
    ref = full.float()
    rel = float((single_logits - ref).norm() / ref.norm())
    # HF against itself: step-by-step over a DynamicCache vs the one full forward above.
    cache = DynamicCache(config=target.model.config)
    with torch.inference_mode():
        rows = [target.model(input_ids=torch.tensor([ids], device=target.device),
                             pixel_values_videos=pix, past_key_values=cache, use_cache=True,
                             logits_to_keep=1).logits[0, -1]]  # fmt: skip
        for tok in cont:
            step = torch.tensor([[tok]], device=target.device)
            rows.append(target.model(input_ids=step, past_key_values=cache).logits[0, -1])
    hf_inc = torch.stack(rows)[:, :vocab].float().argmax(-1)  # [n + 1]
    return {
        "agree_hf_incremental_vs_hf_full": float((hf_inc == hf_greedy).float().mean()),
        "tokens": float(n_tokens + 1),
        "agree_hf_single": float((single == hf_greedy).float().mean()),
        "agree_hf_chunk9": float((chunked == hf_greedy).float().mean()),
        "agree_single_vs_chunk9": float((single == chunked).float().mean()),
        "logits_rel_err_vs_hf": rel,
    }
