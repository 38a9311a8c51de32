"""Draft verification: greedy matching and rejection sampling. Pure tensor functions.

Speculative decoding is lossless only if the verifier follows the papers exactly:

- Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative
  Decoding", ICML 2023 (arXiv:2211.17192), Algorithm 1;
- Chen, Borgeaud, Irving, Lespiau, Sifre, Jumper, "Accelerating Large Language Model
  Decoding with Speculative Sampling", 2023 (arXiv:2302.01318), Algorithm 2.

Row ``i`` of the target's logits is the distribution of the token after the committed
sequence plus ``drafts[:i]``. With ``n`` rows and ``k <= n`` drafts the verifier
accepts a prefix, then emits one more token from the first row it did not accept: a
correction (after a rejection) or a bonus (all ``k`` accepted and row ``k`` exists).
With ``n == k`` (right after prefill, one row checks the first hidden draft) there is
no bonus row.

The edge drafts greedily, so the draft distribution ``q`` is one-hot at the draft
``x``. The papers' acceptance ratio ``min(1, p(x)/q(x))`` is then ``p(x)``, and the
residual ``norm(max(0, p - q))`` is ``p`` with ``x`` removed, renormalised.

Callers mask the logits with :func:`mask_non_text` first; target-only decoding
applies the same mask and the same functions, so both paths pick identical tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VerifyResult:
    """``accepted`` drafts were kept; ``tokens`` is them plus the correction/bonus, if any."""

    accepted: int
    tokens: list[int]


def mask_non_text(logits: torch.Tensor, text_vocab_size: int) -> torch.Tensor:
    """Return a copy of ``logits`` [..., V] with ids >= ``text_vocab_size`` set to -inf.

    The target must never emit ``<image>``, ``<video>``, ``<pad>`` or the padding rows
    of its embedding matrix; masking them here (and identically in target-only
    decoding, like ``generate(suppress_tokens=...)``) keeps both paths in agreement.
    """
    vocab = logits.shape[-1]
    if not 0 < text_vocab_size <= vocab:
        raise ValueError(f"text_vocab_size {text_vocab_size} outside 1..{vocab}")
    out = logits.clone()
    out[..., text_vocab_size:] = float("-inf")
    return out


def _check(logits: torch.Tensor, drafts: Sequence[int]) -> None:
    if logits.dim() != 2 or logits.shape[0] < 1:
        raise ValueError(f"logits must be [n >= 1, V], got {list(logits.shape)}")
    if len(drafts) > logits.shape[0]:
        raise ValueError(
            f"{len(drafts)} drafts need at least as many logit rows, got {logits.shape[0]}"
        )
    vocab = logits.shape[1]
    for d in drafts:
        if not 0 <= int(d) < vocab:
            raise ValueError(f"draft id {d} outside 0..{vocab - 1}")


def verify_greedy(logits: torch.Tensor, drafts: Sequence[int]) -> VerifyResult:
    """Accept the longest prefix of ``drafts`` that matches the target's argmax.

    logits: [n, V] with n >= len(drafts). Ties go to the lowest id (``torch.argmax``
    returns the first maximal index), which is also what ``generate`` does, so
    temperature-0 output equals target-only greedy decoding token for token.
    """
    _check(logits, drafts)
    best: list[int] = logits.argmax(dim=-1).tolist()  # [n]
    k = len(drafts)
    accepted = 0
    while accepted < k and int(drafts[accepted]) == best[accepted]:
        accepted += 1
    tokens = [int(d) for d in drafts[:accepted]]
    if accepted < k:
        tokens.append(best[accepted])  # correction
    elif logits.shape[0] > k:
        tokens.append(best[k])  # bonus
    return VerifyResult(accepted=accepted, tokens=tokens)


def probs_from_logits(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Target sampling distribution: softmax(logits / T), then top-p (nucleus) filtering.

    logits [n, V] -> probs [n, V] float32. The nucleus keeps the most probable ids
    until their mass reaches ``top_p``, and always the single most probable id (ties
    broken by id, via a stable sort), so the result is deterministic.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [n, V]
    if top_p >= 1.0:
        return probs
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # [n, V]
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # [n, V] mass of strictly better ids
    drop = mass_before >= top_p  # [n, V]
    drop[..., 0] = False
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_p)  # [n, V]
    return kept / kept.sum(dim=-1, keepdim=True)


def sample(probs_row: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one id from a probability row [V] with the request's generator."""
    return int(torch.multinomial(probs_row, 1, generator=generator).item())


def verify_sampling(
    logits: torch.Tensor,
    drafts: Sequence[int],
    temperature: float,
    top_p: float,
    generator: torch.Generator,
) -> VerifyResult:
    """Rejection-sample greedy (one-hot ``q``) drafts against the target distribution.

    logits: [n, V] with n >= len(drafts), on the generator's device (CPU). For draft x
    at row i: accept with probability p_i(x) (Leviathan et al. Alg. 1 with q(x) = 1);
    on rejection emit a sample of p_i with x removed and renormalised, and stop. If all
    drafts pass and a row remains, emit a bonus sample from it. The emitted tokens are
    then distributed exactly as sampling from the target one token at a time.
    """
    _check(logits, drafts)
    probs = probs_from_logits(logits, temperature, top_p)  # [n, V]
    tokens: list[int] = []
    for i, draft in enumerate(drafts):
        x = int(draft)
        p_x = float(probs[i, x])
        u = float(torch.rand((), generator=generator))  # U[0, 1): p_x == 1 always accepts
        if u < p_x:
            tokens.append(x)
            continue
        residual = probs[i].clone()  # [V]
        residual[x] = 0.0
        total = float(residual.sum())
        if total <= 0.0:
            # p(x) rounds to 1 in float32 while u >= p(x): x is the only id left.
            tokens.append(x)
            continue
        tokens.append(sample(residual / total, generator))  # correction
        return VerifyResult(accepted=i, tokens=tokens)
    k = len(drafts)
    if probs.shape[0] > k:
        tokens.append(sample(probs[k], generator))  # bonus
    return VerifyResult(accepted=k, tokens=tokens)


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator for one request, so its samples replay from its seed alone."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
    return generator
