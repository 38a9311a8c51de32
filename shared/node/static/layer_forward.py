"""The static runtime's decoder layer, attention and LM head, on the kernels its
:class:`.kernel_choice.KernelChoice` names.

Functions of the weights, one layer's K/V memory and the step's or prompt's index
tensors; :class:`.runtime.StaticRuntime` (and its mixed steps) call them. What each
choice means and why is :mod:`.kernel_choice`'s; the layer's arithmetic is
:mod:`.layers`' (plain torch) or :mod:`.kernels`' (fused, CUDA).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from eventspec.shared.node.static import kernels as static_kernels
from eventspec.shared.node.static import layers as layers
from eventspec.shared.node.static.attention import (
    HAVE_TRITON,
    num_splits_for,
    reference_attention,
    splitkv_attention,
)
from eventspec.shared.node.static.buckets import StepInputs
from eventspec.shared.node.static.invariant import (
    invariant_attention,
    invariant_linear,
    invariant_rms_norm,
)
from eventspec.shared.node.static.invariant_kernels import (
    all_dense,
    dense_invariant_linear,
    dense_invariant_linear_add_,
    fixed_split_attention,
    invariant_mm,
    prefill_fixed_split_attention,
)
from eventspec.shared.node.static.invariant_tiles import prefill_tiles
from eventspec.shared.node.static.kernel_choice import (
    KernelChoice,
    LinearKernel,
    NormKernel,
    PromptAttention,
    StepAttention,
    choose_kernels,
)
from eventspec.shared.node.static.kernels import rope_and_write_kv, silu_mul
from eventspec.shared.node.static.kv_memory import rows_of
from eventspec.shared.node.static.pieces import (
    PromptPieces,
    invariant_piece_attention,
    sdpa_piece_attention,
)
from eventspec.shared.node.static.quant import Weight, linear, linear_add_
from eventspec.shared.node.static.weights import LanguageWeights

__all__ = [
    "Attend",
    "LayerFunctions",
    "decoder_layer",
    "kernels_for",
    "layer_functions",
    "lm_head_logits",
    "prompt_attention",
    "step_attention",
]

#: Attention of layer i: (i, queries [M, Hq D]) -> [M, Hq D].
Attend = Callable[[int, torch.Tensor], torch.Tensor]


def kernels_for(weights: LanguageWeights, *, batch_invariant: bool, use_graphs: bool,
                compile_layers: bool) -> KernelChoice:
    """:func:`.kernel_choice.choose_kernels` for these weights on their device, with
    the Triton this process has."""
    return choose_kernels(device_type=weights.embed.device.type, have_triton=HAVE_TRITON,
                          dense_weights=all_dense(weights), batch_invariant=batch_invariant,
                          use_graphs=use_graphs, compile_layers=compile_layers)


@dataclass(frozen=True)
class LayerFunctions:
    """The callables a choice's norm and linear kernels name."""

    norm: Callable[..., Any]
    lin: layers.Linear
    #: ``h += x @ w.T`` in place (the fused layer's residual add).
    lin_add_: Callable[[torch.Tensor, torch.Tensor, Weight], torch.Tensor]


def layer_functions(choice: KernelChoice) -> LayerFunctions:
    """The norm and linear functions of ``choice`` (Inductor compiles its norm here)."""
    norm: Callable[..., Any]
    if choice.norm is NormKernel.COMPILED:
        norm = torch.compile(layers.rms_norm, dynamic=True, fullgraph=True)
    else:
        norm = {NormKernel.TORCH: layers.rms_norm, NormKernel.INVARIANT_TILES: invariant_rms_norm,
                NormKernel.TRITON: static_kernels.rms_norm}[choice.norm]
    if choice.linear is LinearKernel.INVARIANT_TRITON:
        return LayerFunctions(norm, dense_invariant_linear, dense_invariant_linear_add_)
    lin = invariant_linear if choice.linear is LinearKernel.INVARIANT_TILES else linear
    return LayerFunctions(norm, lin, linear_add_)


def step_attention(choice: KernelChoice, w: LanguageWeights, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, inp: StepInputs, sm_count: int) -> Attend:
    """Attention of a padded step's queries [Bp Qp, Hq D] over their sessions' KV
    (``k_cache``, ``v_cache``: [L, S+1, Hkv, T, D])."""
    bp, qp, hq, d = inp.sessions, inp.tokens, w.num_heads, w.head_dim
    num_splits = num_splits_for(bp, hq, sm_count)
    kind = choice.step_attention

    def attend(i: int, q: torch.Tensor) -> torch.Tensor:
        q4 = q.view(bp, qp, hq, d)  # [Bp, Qp, Hq, D]
        kc, vc = k_cache[i], v_cache[i]  # [S+1, Hkv, T, D]
        if kind is StepAttention.FIXED_SPLIT:
            o = fixed_split_attention(q4, kc, vc, inp.slots, inp.starts, inp.seq_lens)
        elif kind is StepAttention.INVARIANT_TORCH:
            q_pos = inp.starts[:, None] + torch.arange(qp, device=q.device)  # [Bp, Qp]
            o = invariant_attention(q4, kc, vc, inp.slots, q_pos)  # [Bp, Qp, Hq, D]
        elif kind is StepAttention.SPLITKV:
            o = splitkv_attention(
                q4, kc, vc, inp.slots, inp.starts, inp.seq_lens, num_splits=num_splits
            )  # [Bp, Qp, Hq, D]
        else:
            o = reference_attention(q4, kc, vc, inp.slots, inp.starts, inp.seq_lens)
        return o.reshape(bp * qp, hq * d)  # [M, Hq D]

    return attend


def prompt_attention(choice: KernelChoice, w: LanguageWeights, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, pieces: PromptPieces, length_step: int) -> Attend:
    """Attention of prompt pieces' queries [M, Hq D]: causal over each piece's slot up
    to its end, reading its K/V back (the layer wrote them first). ``length_step``:
    :func:`.pieces.sdpa_piece_attention`'s rounding of whole prompts."""
    d, hq = w.head_dim, w.num_heads
    kind = choice.prompt_attention
    tiles = None
    if kind is PromptAttention.FIXED_SPLIT:
        tiles = prefill_tiles(pieces.slots, pieces.starts, pieces.lengths, w.embed.device)

    def attend(i: int, q: torch.Tensor) -> torch.Tensor:
        if tiles is not None:
            o = prefill_fixed_split_attention(q.view(-1, hq, d), k_cache[i], v_cache[i],
                                              tiles)  # [M, Hq, D]
            return o.view(-1, hq * d)  # [M, Hq D]
        if kind is PromptAttention.INVARIANT_TORCH:
            return invariant_piece_attention(q, k_cache[i], v_cache[i], pieces, hq)
        return sdpa_piece_attention(q, k_cache[i], v_cache[i], pieces, hq, length_step)

    return attend


def decoder_layer(
    choice: KernelChoice, fns: LayerFunctions, w: LanguageWeights, i: int, h: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
    write_slot: torch.Tensor, write_pos: torch.Tensor, attend: Attend,
) -> torch.Tensor:
    """Decoder layer i over M rows: h [M, H] -> [M, H]; row m's K/V go to
    (write_slot[m], write_pos[m]) of the layer's cache kc, vc [S+1, Hkv, T, D] before
    ``attend`` reads it."""
    lw = w.layers[i]
    hq, hkv, d = w.num_heads, w.num_kv_heads, w.head_dim
    if choice.fused_layers:
        qkv = fns.lin(fns.norm(h, lw.ln_attn, w.eps), lw.wqkv)  # [M, (Hq + 2 Hkv) D]
        q = rope_and_write_kv(qkv, cos, sin, kc, vc, write_slot, write_pos, hq, hkv)
        # In-place addmm: the residual add rides in the GEMM epilogue, and no copy of
        # h is made first (out-of-place addmm copies its input into the result).
        fns.lin_add_(h, attend(i, q), lw.wo)  # [M, H]
        gate_up = fns.lin(fns.norm(h, lw.ln_mlp, w.eps), lw.w_gate_up)  # [M, 2 I]
        return fns.lin_add_(h, silu_mul(gate_up), lw.w_down)  # [M, H]
    q, k, v = layers.attention_in(h, lw.ln_attn, lw.wqkv, cos, sin, w.eps, hq, hkv,
                                  fns.lin, fns.norm)
    heads = torch.arange(hkv, device=h.device)  # [Hkv]
    s_slot, s_head, s_pos = (st // d for st in kc.stride()[:3])  # in rows of D
    rows = (write_slot[:, None] * s_slot + heads * s_head
            + write_pos[:, None] * s_pos).view(-1)  # [M Hkv]
    rows_of(kc).index_copy_(0, rows, k.view(-1, d))
    rows_of(vc).index_copy_(0, rows, v.view(-1, d))
    o = attend(i, q)  # [M, Hq D]
    return layers.attention_out_and_mlp(h, o, lw.wo, lw.ln_mlp, lw.w_gate_up, lw.w_down,
                                        w.eps, fns.lin, fns.norm)


def lm_head_logits(choice: KernelChoice, fns: LayerFunctions, w: LanguageWeights,
                   x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """A padded step's normed rows x [M, H] -> [M, V] logits (into ``out`` when
    given): the batch-invariant GEMM of the choice, else the library's."""
    logits: torch.Tensor
    if choice.linear is LinearKernel.INVARIANT_TRITON:
        assert isinstance(w.lm_head, torch.Tensor)
        logits = invariant_mm(x, w.lm_head, out=out)  # [M, V]
        return logits
    if choice.linear is LinearKernel.INVARIANT_TILES:
        logits = fns.lin(x, w.lm_head)  # [M, V]
        return logits if out is None else out.copy_(logits)
    if out is None:
        logits = x @ w.lm_head.t()  # [M, V]
        return logits
    torch.matmul(x, w.lm_head.t(), out=out)
    return out
