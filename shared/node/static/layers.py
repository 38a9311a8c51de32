"""The LLaMA decoder's arithmetic as plain functions over flat token rows.

Each function takes ``M`` token rows (any number: one session's prompt, or B padded
sessions of Q tokens) and reproduces ``transformers``' LLaMA modules operation for
operation, so on CPU in float32 the static engine matches the HF model to rounding.
They are the CPU path and the reference. On CUDA the engine keeps ``rms_norm``
(compiled once with ``torch.compile(dynamic=True)``, so one compilation serves every
bucket) and replaces the rest with fused Triton kernels (``static_kernels``) and
cuBLAS GEMMs with the residual add fused (``addmm``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from eventspec.shared.node.static.quant import Weight, linear

#: ``linear``'s signature; the batch-invariant mode swaps in a tiled one.
Linear = Callable[[torch.Tensor, Weight], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``LlamaRMSNorm``: normalise in float32, cast back, then scale. x: [M, H]."""
    xf = x.float()  # [M, H]
    var = xf.pow(2).mean(-1, keepdim=True)  # [M, 1]
    return weight * (xf * torch.rsqrt(var + eps)).to(x.dtype)  # [M, H]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's ``apply_rotary_pos_emb`` (rotate-half variant). x: [M, h, D]; cos, sin: [M, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [M, h, D]
    return x * cos[:, None] + rotated * sin[:, None]  # [M, h, D]


def attention_in(
    h: torch.Tensor,
    ln: torch.Tensor,
    wqkv: Weight,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    num_heads: int,
    num_kv_heads: int,
    lin: Linear = linear,
    norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] = rms_norm,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Norm, fused QKV projection and RoPE. h: [M, H] -> q [M, Hq, D], k, v [M, Hkv, D]."""
    m = h.shape[0]
    d = cos.shape[-1]
    qkv = lin(norm(h, ln, eps), wqkv)  # [M, (Hq + 2 Hkv) D]
    q = qkv[:, : num_heads * d].view(m, num_heads, d)  # [M, Hq, D]
    k = qkv[:, num_heads * d : (num_heads + num_kv_heads) * d].view(m, num_kv_heads, d)
    v = qkv[:, (num_heads + num_kv_heads) * d :].reshape(m, num_kv_heads, d)  # [M, Hkv, D]
    return rotate(q, cos, sin).contiguous(), rotate(k, cos, sin).contiguous(), v.contiguous()


def attention_out_and_mlp(
    h: torch.Tensor,
    attn: torch.Tensor,
    wo: Weight,
    ln: torch.Tensor,
    w_gate_up: Weight,
    w_down: Weight,
    eps: float,
    lin: Linear = linear,
    norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] = rms_norm,
) -> torch.Tensor:
    """Output projection + residual, then the SiLU-gated MLP + residual.

    h: [M, H] residual stream; attn: [M, Hq D] -> the next layer's input [M, H].
    """
    h = h + lin(attn, wo)  # [M, H]
    gate_up = lin(norm(h, ln, eps), w_gate_up)  # [M, 2 I]
    inter = gate_up.shape[-1] // 2
    act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]  # [M, I]
    return h + lin(act, w_down)  # [M, H]
