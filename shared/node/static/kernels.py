"""Fused element-wise kernels of the static engine's CUDA path (Triton).

Measured on an H200 (``docs/engine.md``): with ``torch.compile(dynamic=True)`` the
rotary embedding, the ``v`` copy and the two KV ``index_copy_`` launches of one layer
ran at 0.5-1.5 TB/s and cost ~9 ms of a 2.1k-token prefill and ~2.4 ms of a
64-session verify step. These kernels replace them:

- :func:`rope_and_write_kv`: one pass over the fused QKV projection: rotates q and k
  (HF's rotate-half RoPE), writes q out, and writes k and v straight into their KV
  slots (vLLM's ``reshape_and_cache`` idea, fused with the rotation);
- :func:`rms_norm`: ``LlamaRMSNorm`` in one pass (Inductor's version also worked but
  added a device copy per call and a compilation per process);
- :func:`silu_mul`: ``silu(gate) * up`` over the fused gate-up projection, rounding
  like the HF module (SiLU rounded to the activation dtype, then the product).

The CPU path computes the same functions with plain torch ops (:mod:`.layers`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from eventspec.shared.node.static.attention import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def _rope_kv_kernel(  # type: ignore[no-untyped-def]
        QKV, Cos, Sin, Qout, KC, VC, WSlot, WPos,
        s_qkv, s_cos, s_q_m, s_q_h,
        sk_s, sk_h, sk_t, sv_s, sv_h, sv_t,
        NUM_Q_BLOCKS: tl.constexpr, HB: tl.constexpr, HEADS_Q: tl.constexpr,
        HEADS_KV: tl.constexpr, HALF: tl.constexpr,
    ):  # fmt: skip
        """One token row x one block of HB heads (q heads first, then k/v heads)."""
        m = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1)
        offs_h = tl.arange(0, HB)
        offs_d = tl.arange(0, HALF)
        c1 = tl.load(Cos + m * s_cos + offs_d).to(tl.float32)[None, :]
        c2 = tl.load(Cos + m * s_cos + HALF + offs_d).to(tl.float32)[None, :]
        s1 = tl.load(Sin + m * s_cos + offs_d).to(tl.float32)[None, :]
        s2 = tl.load(Sin + m * s_cos + HALF + offs_d).to(tl.float32)[None, :]
        row = QKV + m * s_qkv
        if blk < NUM_Q_BLOCKS:
            heads = blk * HB + offs_h  # [HB]
            src = row + heads[:, None] * (2 * HALF) + offs_d[None, :]
            x1 = tl.load(src).to(tl.float32)  # [HB, HALF]
            x2 = tl.load(src + HALF).to(tl.float32)
            dst = Qout + m * s_q_m + heads[:, None] * s_q_h + offs_d[None, :]
            tl.store(dst, (x1 * c1 - x2 * s1).to(Qout.dtype.element_ty))
            tl.store(dst + HALF, (x2 * c2 + x1 * s2).to(Qout.dtype.element_ty))
        else:
            heads = (blk - NUM_Q_BLOCKS) * HB + offs_h  # kv heads [HB]
            slot = tl.load(WSlot + m)
            pos = tl.load(WPos + m)
            k_src = row + (HEADS_Q + heads[:, None]) * (2 * HALF) + offs_d[None, :]
            v_src = k_src + HEADS_KV * 2 * HALF
            x1 = tl.load(k_src).to(tl.float32)
            x2 = tl.load(k_src + HALF).to(tl.float32)
            k_dst = KC + slot * sk_s + heads[:, None] * sk_h + pos * sk_t + offs_d[None, :]
            tl.store(k_dst, (x1 * c1 - x2 * s1).to(KC.dtype.element_ty))
            tl.store(k_dst + HALF, (x2 * c2 + x1 * s2).to(KC.dtype.element_ty))
            v_dst = VC + slot * sv_s + heads[:, None] * sv_h + pos * sv_t + offs_d[None, :]
            tl.store(v_dst, tl.load(v_src))
            tl.store(v_dst + HALF, tl.load(v_src + HALF))

    @triton.jit  # type: ignore[untyped-decorator]
    def _rms_norm_kernel(  # type: ignore[no-untyped-def]
        X, W, Out, s_x, s_out, N, eps, BLOCK: tl.constexpr
    ):
        m = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        ok = offs < N
        x = tl.load(X + m * s_x + offs, mask=ok, other=0.0).to(tl.float32)
        var = tl.sum(x * x, 0) / N
        normed = (x * tl.rsqrt(var + eps)).to(Out.dtype.element_ty).to(tl.float32)
        w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(Out + m * s_out + offs, (w * normed).to(Out.dtype.element_ty), mask=ok)

    @triton.jit  # type: ignore[untyped-decorator]
    def _silu_mul_kernel(  # type: ignore[no-untyped-def]
        GU, Out, s_gu, s_out, INTER, BLOCK: tl.constexpr
    ):
        m = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < INTER
        g = tl.load(GU + m * s_gu + offs, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(GU + m * s_gu + INTER + offs, mask=ok, other=0.0).to(tl.float32)
        act = (g * tl.sigmoid(g)).to(Out.dtype.element_ty).to(tl.float32)
        tl.store(Out + m * s_out + offs, (act * u).to(Out.dtype.element_ty), mask=ok)


def rope_and_write_kv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    write_slot: torch.Tensor,
    write_pos: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """Rotate q/k of ``qkv`` and write k, v into the cache; return q.

    qkv: [M, (Hq + 2 Hkv) D] (unit stride on the last dim); cos, sin: [M, D];
    k_cache, v_cache: [S, Hkv, T, D]; write_slot, write_pos: [M]. Returns q
    [M, Hq, D] contiguous. Row m's k/v land at (write_slot[m], :, write_pos[m]).
    """
    if not HAVE_TRITON:
        raise RuntimeError("rope_and_write_kv needs Triton")
    m, d = qkv.shape[0], cos.shape[-1]
    q = torch.empty((m, num_heads, d), device=qkv.device, dtype=qkv.dtype)  # [M, Hq, D]
    hb = math.gcd(num_heads, num_kv_heads, 8)
    nqb, nkb = num_heads // hb, num_kv_heads // hb
    kernel: Any = _rope_kv_kernel
    kernel[(m, nqb + nkb)](
        qkv, cos, sin, q, k_cache, v_cache, write_slot, write_pos,
        qkv.stride(0), cos.stride(0), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_Q_BLOCKS=nqb, HB=hb, HEADS_Q=num_heads, HEADS_KV=num_kv_heads, HALF=d // 2,
        num_warps=2,
    )  # fmt: skip
    return q


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``LlamaRMSNorm`` on [M, H] rows: float32 statistics, cast back, then scale."""
    if not HAVE_TRITON:
        raise RuntimeError("rms_norm needs Triton")
    m, n = x.shape
    out = torch.empty_like(x)  # [M, H]
    block = triton.next_power_of_2(n)
    kernel: Any = _rms_norm_kernel
    kernel[(m,)](x, weight, out, x.stride(0), out.stride(0), n, eps, BLOCK=block,
                 num_warps=8 if block >= 4096 else 4)  # fmt: skip
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for gate_up [M, 2 I] -> [M, I] (HF's rounding order)."""
    if not HAVE_TRITON:
        raise RuntimeError("silu_mul needs Triton")
    m, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((m, inter), device=gate_up.device, dtype=gate_up.dtype)  # [M, I]
    block = 1024
    kernel: Any = _silu_mul_kernel
    kernel[(m, triton.cdiv(inter, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4
    )
    return out
