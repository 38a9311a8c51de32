"""Prompt pieces as one activation, and their attention: what a prefill, a chunk and a
mixed step's prompt rows share (:mod:`.runtime`).

A piece is rows ``start`` .. ``start + L - 1`` of one prompt, going into one slot; a
call's pieces are concatenated so every GEMM runs once for all of them (Sarathi-Serve,
Agrawal et al., OSDI 2024, chunks prompts this way). Their attention is causal over
each piece's slot up to its end: the rows before ``start`` are already in the slot (an
earlier chunk, or a reused prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.invariant import invariant_attention
from eventspec.shared.node.static.invariant_tiles import cdiv
from eventspec.shared.node.static.slot_occupancy import SlotOccupancy


@dataclass(frozen=True)
class PromptPieces:
    """Pieces laid out as one activation: piece r is rows ``offsets[r]`` ..
    ``offsets[r + 1] - 1``, positions ``starts[r]`` on, of ``slots[r]``."""

    slots: list[int]
    starts: list[int]
    lengths: list[int]
    offsets: list[int]  # [R + 1]
    h: torch.Tensor  # [M, H] embeddings in the model dtype
    pos: torch.Tensor  # [M] positions (RoPE rows and where K/V go)
    write_slot: torch.Tensor  # [M]
    last_rows: torch.Tensor  # [R] each piece's last row


def check_pieces(occupancy: SlotOccupancy, hidden: int, slots: Sequence[int],
                 embeds: Sequence[torch.Tensor], starts: Sequence[int]) -> None:
    """InvalidInput unless every piece ([L, hidden] embeddings) fits its slot and
    continues what it holds."""
    if not slots or not len(slots) == len(embeds) == len(starts):
        raise InvalidInput("prefill needs one embedding and one start per slot, at least one")
    for s, e in zip(slots, embeds, strict=True):
        if e.dim() != 2 or e.shape[1] != hidden:
            raise InvalidInput(
                f"slot {s}: embeddings must be [L, {hidden}], got {list(e.shape)}"
            )
    occupancy.check_runs(slots, starts, [int(e.shape[0]) for e in embeds])


def lay_out(slots: Sequence[int], embeds: Sequence[torch.Tensor], starts: Sequence[int],
            dtype: torch.dtype, device: torch.device) -> PromptPieces:
    """The pieces (already checked) as one activation. embeds[r]: [L_r, H]."""
    lengths = [int(e.shape[0]) for e in embeds]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return PromptPieces(
        slots=list(slots), starts=list(starts), lengths=lengths, offsets=offsets,
        h=torch.cat([e.to(dtype) for e in embeds]),  # [M, H]
        pos=torch.cat([torch.arange(st, st + n, device=device)
                       for st, n in zip(starts, lengths, strict=True)]),  # [M]
        write_slot=torch.cat([torch.full((n,), s, device=device)
                              for s, n in zip(slots, lengths, strict=True)]),  # [M]
        last_rows=torch.tensor([off - 1 for off in offsets[1:]], device=device),  # [R]
    )


#: Whole prompts' attention runs at lengths rounded up to this many rows (see
#: :func:`sdpa_piece_attention`).
PROMPT_LENGTH_STEP = 128


def padded_length(n: int, limit: int, step: int = PROMPT_LENGTH_STEP) -> int:
    """``n`` rounded up to a multiple of ``step``, at most ``limit`` (and never below n)."""
    return max(n, min(cdiv(n, step) * step, limit))


def sdpa_piece_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         pieces: PromptPieces, num_heads: int,
                         length_step: int = PROMPT_LENGTH_STEP) -> torch.Tensor:
    """Causal SDPA of each piece's queries over its slot's K/V up to the piece's end.

    q: [M, Hq, D] or [M, Hq D]; k_cache, v_cache: one layer's [S, Hkv, T, D] (the layer wrote the
    pieces' K/V first). Returns [M, Hq D]. Flash attention on CUDA where it applies.

    A whole prompt (start 0) runs causal at its length rounded up to ``length_step``
    rows: zero query rows after it, and the slot's next key rows, whatever they hold.
    Causality keeps every real row from seeing them, so its output is the unpadded
    one. Why: on Hopper, SDPA picks cuDNN's attention for a causal prompt, and cuDNN
    builds an execution plan for every new (queries, keys) shape: about 50 ms the first
    time each prompt length is seen (H100, 2.1k tokens: 95-105 ms first calls against
    46-48 ms again; ``benchmarks/bench_engine.py --prefill-only``), which every new
    question length paid in its time to first token. Rounded, a server meets at most
    T / ``length_step`` shapes, and :meth:`.runtime.StaticRuntime.warm_up` plans them
    all before serving.
    """
    hq, hkv, d = num_heads, k_cache.shape[1], k_cache.shape[3]
    outs = []
    for s, n, off, st in zip(pieces.slots, pieces.lengths, pieces.offsets, pieces.starts,
                             strict=False):
        if st == 0:
            outs.append(_padded_causal(q[off : off + n].reshape(n, hq, d), k_cache[s],
                                       v_cache[s], length_step))  # [L, Hq D]
            continue
        k = k_cache[s, :, : st + n]  # [Hkv, st + L, D]
        v = v_cache[s, :, : st + n]  # [Hkv, st + L, D]
        # A continuation (a chunk, or the rest after a reused prefix) is causal aligned
        # to the bottom right: query j sees keys 0 .. st + j. As a CausalBias it runs
        # flash / memory-efficient attention; an explicit boolean mask ran cuDNN's SDPA
        # on an H200, which builds a graph for every new (queries, keys) shape (hundreds
        # of ms, pytorch/pytorch#191576 and sgl-project/sglang#4650 measured it), and
        # chunk shapes vary.
        o = F.scaled_dot_product_attention(
            q[off : off + n].reshape(n, hq, d).transpose(0, 1)[None], k[None], v[None],
            attn_mask=causal_lower_right(n, st + n), enable_gqa=hq != hkv,
        )  # [1, Hq, L, D]
        outs.append(o[0].transpose(0, 1).reshape(n, hq * d))  # [L, Hq D]
    return torch.cat(outs)  # [M, Hq D]


def _padded_causal(q: torch.Tensor, k_slot: torch.Tensor, v_slot: torch.Tensor,
                   length_step: int) -> torch.Tensor:
    """Causal SDPA of a whole prompt's queries q [L, Hq, D] over the first rows of one
    slot's k_slot, v_slot [Hkv, T, D], at the rounded length (:func:`sdpa_piece_attention`).
    Returns [L, Hq D]."""
    n, hq, d = q.shape
    n_pad = padded_length(n, k_slot.shape[1], length_step)
    if n_pad > n:
        q = torch.cat([q, q.new_zeros(n_pad - n, hq, d)])  # [L', Hq, D]
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k_slot[None, :, :n_pad], v_slot[None, :, :n_pad],
        is_causal=True, enable_gqa=hq != k_slot.shape[0],
    )  # [1, Hq, L', D]
    return o[0, :, :n].transpose(0, 1).reshape(n, hq * d)  # [L, Hq D]


def plan_prompt_attention(k_slot: torch.Tensor, v_slot: torch.Tensor, num_heads: int,
                          length_step: int = PROMPT_LENGTH_STEP) -> int:
    """Run the whole-prompt attention once at every rounded length a slot k_slot, v_slot
    [Hkv, T, D] can hold, so the attention backend plans each shape before serving
    (:func:`sdpa_piece_attention` says why). Returns how many shapes it ran."""
    _, t, d = k_slot.shape
    lengths = sorted({padded_length(n, t, length_step) for n in range(1, t + 1, length_step)})
    for n in lengths:
        _padded_causal(k_slot.new_zeros(n, num_heads, d), k_slot, v_slot, length_step)
    return len(lengths)


def invariant_piece_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              pieces: PromptPieces, num_heads: int) -> torch.Tensor:
    """Each piece's queries through :func:`.invariant.invariant_attention` (the plain,
    batch-invariant path), so a prompt row gives the bits a decode step at its position
    would. q: [M, Hq D]; k_cache, v_cache: one layer's [S, Hkv, T, D]. Returns [M, Hq D]."""
    hq, d = num_heads, k_cache.shape[3]
    outs = []
    for s, n, off, st in zip(pieces.slots, pieces.lengths, pieces.offsets, pieces.starts,
                             strict=False):
        q4 = q[off : off + n].view(1, n, hq, d)  # [1, L, Hq, D]
        slot = torch.tensor([s], device=q.device)  # [1]
        pos = torch.arange(st, st + n, device=q.device)[None]  # [1, L]
        o = invariant_attention(q4, k_cache, v_cache, slot, pos)
        outs.append(o.reshape(n, hq * d))  # [L, Hq D]
    return torch.cat(outs)  # [M, Hq D]
