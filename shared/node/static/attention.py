"""Attention of a verify/decode step over slot-owned KV: reads each session's real length.

A step holds ``Bp`` sessions of ``Q`` query tokens each (padded). Session ``b`` lives in
KV slot ``slot[b]``; its query row ``j`` sits at position ``start[b] + j`` and may see
cached positions ``p`` with ``p <= start[b] + j`` and ``p < seq_len[b]`` (causal within
the new tokens, nothing past the session's length). Everything beyond ``seq_len`` in
the slot is garbage from rejected drafts and is never read.

Two implementations of that one function:

- :func:`splitkv_attention`, a Triton split-KV kernel (FlashDecoding: Dao et al.,
  "Flash-Decoding for long-context inference", 2023; the same split/combine scheme as
  vLLM's paged-attention v2 and gpt-fast's decoding path). Each program owns one
  (session, head, split) and walks only ``[lo, hi)`` of that session's keys, so the
  bytes read scale with the live KV, not with the slot size; a second kernel merges
  the splits by their log-sum-exp. Splits keep the GPU full when few sessions step.
  The loop and the merge are :mod:`.split_softmax`'s, shared with the batch-invariant
  kernel of :mod:`.invariant_kernels`.
- :func:`reference_attention`, dense masked SDPA over whole slots: the CPU path and
  the oracle the kernel is checked against.

Why this and not FlexAttention or dense SDPA: ``docs/engine.md`` has the measurement
(``benchmarks/bench_engine.py`` times all three on the same step shapes).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from eventspec.shared.node.static.split_softmax import HAVE_TRITON

__all__ = ["HAVE_TRITON", "num_splits_for", "reference_attention", "splitkv_attention"]

if HAVE_TRITON:  # Triton exists where CUDA does; CPU-only installs run the reference path.
    import triton
    import triton.language as tl

    from eventspec.shared.node.static.split_softmax import merge_splits, online_softmax_split


def reference_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    """Dense masked attention over whole slots (the oracle and the CPU path).

    q: [Bp, Q, H, D]; k_cache, v_cache: [S, Hkv, T, D]; slots, starts, seq_lens: [Bp].
    Returns [Bp, Q, H, D] in q's dtype. On CUDA it reads all T positions of each slot
    (no host read, so it stays graph-safe), so there it is only for tests; on CPU it
    reads the first max(seq_lens) positions.
    """
    nq, nh = q.shape[1], q.shape[2]
    n_kv, t = k_cache.shape[1], k_cache.shape[2]
    if q.device.type == "cpu":  # read only the positions in use (a host read is free here)
        t = max(1, min(t, int(seq_lens.max())))
    k = k_cache[:, :, :t].index_select(0, slots)  # [Bp, Hkv, T, D]
    v = v_cache[:, :, :t].index_select(0, slots)  # [Bp, Hkv, T, D]
    if n_kv != nh:
        k = k.repeat_interleave(nh // n_kv, dim=1)  # [Bp, H, T, D]
        v = v.repeat_interleave(nh // n_kv, dim=1)  # [Bp, H, T, D]
    kv_pos = torch.arange(t, device=q.device)  # [T]
    q_pos = starts[:, None] + torch.arange(nq, device=q.device)  # [Bp, Q]
    allowed = (kv_pos[None, None, :] <= q_pos[:, :, None]) & (
        kv_pos[None, None, :] < seq_lens[:, None, None]
    )  # [Bp, Q, T]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k, v, attn_mask=allowed[:, None]
    )  # [Bp, H, Q, D]
    return out.transpose(1, 2)  # [Bp, Q, H, D]


def num_splits_for(sessions: int, heads: int, sm_count: int, max_splits: int = 16) -> int:
    """How many KV splits per (session, head): enough programs to fill every SM ~4x.

    One session at 32 heads is 32 programs for 132 SMs; 16 splits make 512. At 64
    sessions the grid is already 2048 programs and one split is best.
    """
    want = max(1, math.ceil(4 * sm_count / max(1, sessions * heads)))
    return min(max_splits, 1 << (want - 1).bit_length())


if HAVE_TRITON:

    @triton.jit  # type: ignore[untyped-decorator]
    def _splitkv_kernel(  # type: ignore[no-untyped-def]
        Q, K, V, O_part, LSE_part, Slot, Start, SeqLen,
        sq_b, sq_m, sq_h,
        sk_s, sk_h, sk_t,
        sv_s, sv_h, sv_t,
        so_b, so_s, so_m, so_h,
        sl_b, sl_s, sl_m,
        qk_scale,
        NUM_Q: tl.constexpr, GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    ):  # fmt: skip
        """One (session, head, split): online softmax over keys [lo, hi) of the slot."""
        b = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.program_id(2)
        slot = tl.load(Slot + b).to(tl.int64)
        start = tl.load(Start + b)
        seq_len = tl.load(SeqLen + b)
        per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
        lo = s * per_split
        hi = tl.minimum(lo + per_split, seq_len)

        offs_m = tl.arange(0, BLOCK_M)  # query rows of this session
        offs_d = tl.arange(0, HEAD_DIM)
        q_ptrs = Q + b * sq_b + offs_m[:, None] * sq_m + h * sq_h + offs_d[None, :]
        q = tl.load(q_ptrs, mask=offs_m[:, None] < NUM_Q, other=0.0)  # [BM, D]
        q_pos = start + offs_m  # [BM]
        kvh = h // GROUPS
        k_base = K + slot * sk_s + kvh * sk_h
        v_base = V + slot * sv_s + kvh * sv_h
        out, lse = online_softmax_split(
            q, k_base, v_base, sk_t, sv_t, lo, hi, q_pos, qk_scale,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, PRECISION="default",
            KEEP_UNSEEN=False, WIDE_OFFSETS=False,
        )  # fmt: skip
        row_ok = offs_m < NUM_Q
        o_ptrs = O_part + b * so_b + s * so_s + offs_m[:, None] * so_m + h * so_h + offs_d[None, :]
        tl.store(o_ptrs, out, mask=row_ok[:, None])
        tl.store(LSE_part + b * sl_b + s * sl_s + offs_m * sl_m + h, lse, mask=row_ok)

    @triton.jit  # type: ignore[untyped-decorator]
    def _combine_kernel(  # type: ignore[no-untyped-def]
        O_part, LSE_part, Out,
        so_b, so_s, so_m, so_h,
        sl_b, sl_s, sl_m,
        sout_b, sout_m, sout_h,
        NUM_Q: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    ):  # fmt: skip
        """Merge the splits of one (session, row, head) by their log-sum-exp."""
        bm = tl.program_id(0)
        h = tl.program_id(1)
        b = bm // NUM_Q
        m = bm % NUM_Q
        offs_s = tl.arange(0, NUM_SPLITS)
        offs_d = tl.arange(0, HEAD_DIM)
        lse = tl.load(LSE_part + b * sl_b + offs_s * sl_s + m * sl_m + h)  # [NS]
        parts = tl.load(O_part + b * so_b + offs_s[:, None] * so_s + m * so_m + h * so_h
                        + offs_d[None, :])  # fmt: skip
        out = merge_splits(lse, parts, EMPTY_SAFE=False)  # [D]; empty splits weigh 0
        tl.store(Out + b * sout_b + m * sout_m + h * sout_h + offs_d,
                 out.to(Out.dtype.element_ty))  # fmt: skip


def splitkv_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    num_splits: int,
    block_n: int = 64,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Split-KV attention (the GPU path); same contract as :func:`reference_attention`.

    q: [Bp, Q, H, D] contiguous; k_cache, v_cache: [S, Hkv, T, D] with unit stride on
    D; slots, starts, seq_lens: [Bp] int32 on the device. No host synchronisation:
    lengths are read inside the kernel, so the launch is CUDA-graph safe.
    """
    if not HAVE_TRITON:
        raise RuntimeError("splitkv_attention needs Triton")
    bp, nq, nh, hd = q.shape
    groups = nh // k_cache.shape[1]
    block_m = max(16, triton.next_power_of_2(nq))
    o_part = torch.empty((bp, num_splits, nq, nh, hd), device=q.device, dtype=torch.float32)
    lse = torch.empty((bp, num_splits, nq, nh), device=q.device, dtype=torch.float32)
    if out is None:
        out = torch.empty_like(q)  # [Bp, Q, H, D]
    qk_scale = hd**-0.5 * 1.4426950408889634  # softmax scale in log2 units (exp2 below)
    big = block_m >= 64
    kernel: Any = _splitkv_kernel
    kernel[(bp, nh, num_splits)](
        q, k_cache, v_cache, o_part, lse, slots, starts, seq_lens,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3),
        lse.stride(0), lse.stride(1), lse.stride(2),
        qk_scale,
        NUM_Q=nq, GROUPS=groups, HEAD_DIM=hd, BLOCK_M=block_m, BLOCK_N=block_n,
        NUM_SPLITS=num_splits, num_warps=8 if big else 4, num_stages=2,
    )  # fmt: skip
    combine: Any = _combine_kernel
    combine[(bp * nq, nh)](
        o_part, lse, out,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), o_part.stride(3),
        lse.stride(0), lse.stride(1), lse.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        NUM_Q=nq, HEAD_DIM=hd, NUM_SPLITS=num_splits, num_warps=1,
    )  # fmt: skip
    return out
