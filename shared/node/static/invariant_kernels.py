"""Batch-invariant Triton kernels: the CUDA path of ``--batch-invariant``.

Why: a row's logits must be the same bits alone or in a batch of any size, verifying 0
or 8 drafts, at any place in the step, and a prompt row must get the bits a decode step
at its position would (:mod:`.invariant` says why). cuBLAS and the split-KV kernel of
:mod:`.attention` choose their blocking, split-K and number of KV splits from the
whole call's shape, so a row's reduction order follows the batch. The cure (He et al.,
"Defeating Nondeterminism in LLM Inference", Thinking Machines 2025) is kernels whose
every reduction is fixed by the row alone:

- :func:`invariant_mm`: ``x @ w.T`` with K walked in order into an fp32 accumulator,
  no split-K, the residual add in the epilogue, and a tile from a short per-shape table
  (:func:`.invariant_tiles.mm_config`): M picks one of a few tiles that give a row the
  same bits (below), so a decode step and a prompt each get a fast one. ``M`` is not
  specialised on (``do_not_specialize``), so M = 1 and M % 16 == 0 run the same
  compiled kernel; no autotuning, whose timing-dependent pick could differ between two
  processes.
- :func:`fixed_split_attention`: FlashDecoding's split-KV scheme (Dao et al.,
  "Flash-Decoding for long-context inference", 2023) with a fixed split *size*
  (``SPLIT`` key positions counted from position 0) instead of a split *count*
  chosen from the batch, 16-row query tiles for every Q, and a combine over a number
  of splits fixed by the slot size. The online-softmax loop and the merge are
  :mod:`.split_softmax`'s (shared with :mod:`.attention`'s kernel), with the switches
  this kernel's bits need.
- :func:`prefill_fixed_split_attention`: a prompt piece cut into pseudo-sessions of 16
  queries, each run with the step kernel's arithmetic (four of a slot to a program,
  :mod:`.invariant_prompt`), so a prompt row is computed exactly as a verify or
  decode row at its position.

From 144 rows on, the table's tiles run in a persistent kernel fed by TMA
(:mod:`.invariant_tma`): the same arithmetic, measured bit-equal.

RMSNorm, RoPE + KV write and SiLU-mul (:mod:`.kernels`) are one program per row or
per element already, so they are batch-invariant as they are.

**Why each reduction's order is independent of B, Q, the row's place and seq_len.**

*Matmul.* Output (r, n) is one tile's fp32 accumulator: ``tl.dot(x, w, acc)`` adds
the K chunks in order, 16 products at a time by a tensor-core instruction, into the
same accumulator. Rows of a tile do not mix (an MMA computes each output from its own
row and column), rows past M are masked loads of zero that only feed their own
(dropped) outputs, and the grid's order only decides *when* a tile runs. So row r's
bits are a function of x[r], w and the instruction family; the tile's BLOCK_M/N/K,
warps and stages do not enter, as long as every tile is a wgmma tile (BLOCK_M a
multiple of 64, warps a multiple of 4), which the table keeps (and an H200 confirmed:
``invariant_tiles.MM_CONFIGS`` says where).

*Attention.* A query at position ``p`` of session ``b`` sees keys ``[0, p]`` (its
session's ``seq_len`` is past ``p`` for every real row). Split ``s`` covers keys
``[s * SPLIT, (s + 1) * SPLIT)`` and walks them in blocks of ``BLOCK_N`` from the
split's start, so a block's keys are fixed by the split alone. Within a block the
query's scores are its own row of a 16-row MMA; keys past ``p`` (or past ``seq_len``,
loaded as 0) are set to -inf, so their softmax weight is exactly +0 and they add exact
zeros to the row's sums; a block with no key the query sees leaves the query's running
(max, sum, output) untouched (a per-row select, not arithmetic). How far a split's
loop runs (it depends on the tile's last row and ``seq_len``) therefore changes
nothing for the query. A split with no visible key ends with LSE = -inf and output
+0, the same values the combine's masked load gives a split that was never written.
The combine reduces the ``NUM_SPLITS`` partials (a power of two >= cdiv(T, SPLIT),
fixed by the slot size T) with one fixed tree, weights ``exp2(lse - max)``. So the
query's bits depend on its q row, its slot's keys and values ``[0, p]`` and the
compiled kernel, which depends on neither B nor Q (``BLOCK_M`` is 16 for every Q,
Q > 16 runs as several 16-row tiles, and the Q-dependent arguments are not
specialised on). The one thing this does not pin is the sign of an exactly zero
output, which needs every visible value of that output channel to be exactly zero.

The host-side rules (the tile table, the launch arguments, the pseudo-sessions) are in
:mod:`.invariant_tiles`. Measured on an H200 (``python -m
benchmarks.bench_invariant_kernels``, ``benchmarks/results/invariant-kernels-h200.json``):
every candidate tile is row-invariant; one tile per shape cost 1.10x cuBLAS at M <= 64,
1.76x at M = 144 and 2.51x at M = 2,100 (``--cross-tiles``: the table's tiles by M,
1.09x / 1.49x / 1.49x, ``invariant-cross-tiles-h200.json``; with the persistent
tiles 1.39x at 144 and 1.15x at 2,100, ``invariant-persistent-probe-h200.json``), and
the engine gave
bitwise-equal logits alone and beside 3/15/63 sessions (``batch-invariance-h200-
invariant.json``). Not claimed: that the bits equal cuBLAS's or the CPU path's (they do
not: different kernels, same arithmetic up to rounding).
"""

from __future__ import annotations

from typing import Any

import torch

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.attention import HAVE_TRITON
from eventspec.shared.node.static.invariant_prompt import grouped_prompt_splits
from eventspec.shared.node.static.invariant_tiles import (
    ATTN_BLOCK_N,
    QUERY_TILE,
    SPLIT,
    AttentionLaunch,
    MmConfig,
    PrefillTiles,
    attention_launch,
    mm_config,
    mm_launch,
)
from eventspec.shared.node.static.invariant_tma import persistent_invariant_mm, tma_available
from eventspec.shared.node.static.quant import Weight
from eventspec.shared.node.static.weights import LanguageWeights

__all__ = ["fixed_split_attention", "invariant_mm", "prefill_fixed_split_attention"]


if HAVE_TRITON:
    import triton
    import triton.language as tl

    from eventspec.shared.node.static.split_softmax import merge_splits, online_softmax_split

    @triton.jit(do_not_specialize=["M"])  # type: ignore[untyped-decorator]
    def _invariant_mm_kernel(  # type: ignore[no-untyped-def]
        X, W, Out, M, N, K, s_wn,
        ACCUMULATE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ):  # fmt: skip
        """One BLOCK_M x BLOCK_N output tile over all of K, in order (no split-K).
        X [M, K] and Out [M, N] are row-major; W [N, K] has unit stride on K."""
        pid = tl.program_id(0)
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        per_group = GROUP_M * num_n
        first_m = (pid // per_group) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % size_m
        pid_n = (pid % per_group) // size_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
        offs_k = tl.arange(0, BLOCK_K)  # [BK]
        m_ok = offs_m < M
        n_ok = offs_n < N
        x_ptrs = X + offs_m[:, None].to(tl.int64) * K + offs_k[None, :]  # [BM, BK]
        w_ptrs = W + offs_n[None, :].to(tl.int64) * s_wn + offs_k[:, None]  # [BK, BN]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = offs_k < K - k0
            x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # [BM, BK]
            w = tl.load(w_ptrs, mask=n_ok[None, :] & k_ok[:, None], other=0.0)  # [BK, BN]
            acc = tl.dot(x, w, acc, input_precision=PRECISION)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        dst = Out + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]  # [BM, BN]
        mask = m_ok[:, None] & n_ok[None, :]
        if ACCUMULATE:
            acc += tl.load(dst, mask=mask, other=0.0).to(tl.float32)
        tl.store(dst, acc.to(Out.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=["num_q", "q_tiles"])  # type: ignore[untyped-decorator]
    def _fixed_split_kernel(  # type: ignore[no-untyped-def]
        Q, K, V, O_part, LSE_part, Slot, Start, SeqLen, num_q, q_tiles,
        sq_r, sq_h, sk_s, sk_h, sk_t, sv_s, sv_h, sv_t,
        so_r, so_s, so_h, sl_r, sl_s, qk_scale,
        GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        """One (session's 16-query tile, head, split): online softmax over the split's
        keys the tile may see; a split wholly past them writes nothing."""
        bt = tl.program_id(0)
        h = tl.program_id(1)
        s = tl.program_id(2)
        b = bt // q_tiles
        first = (bt % q_tiles) * BLOCK_M  # the tile's first query row in its session
        start = tl.load(Start + b).to(tl.int32)
        limit = tl.minimum(tl.load(SeqLen + b).to(tl.int32), start + first + BLOCK_M)
        lo = s * SPLIT
        if lo < limit:
            slot = tl.load(Slot + b).to(tl.int64)
            rows = first + tl.arange(0, BLOCK_M)  # [BM] query rows of the session
            row_ok = rows < num_q
            r = (b * num_q + rows).to(tl.int64)  # [BM] rows of the flat [B Q] step
            offs_d = tl.arange(0, HEAD_DIM)
            q = tl.load(Q + r[:, None] * sq_r + h * sq_h + offs_d[None, :],
                        mask=row_ok[:, None], other=0.0)  # [BM, D]
            q_pos = start + rows  # [BM]
            kvh = h // GROUPS
            k_base = K + slot * sk_s + kvh * sk_h
            v_base = V + slot * sv_s + kvh * sv_h
            hi = tl.minimum(lo + SPLIT, limit)
            out, lse = online_softmax_split(
                q, k_base, v_base, sk_t, sv_t, lo, hi, q_pos, qk_scale,
                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HEAD_DIM=HEAD_DIM, PRECISION=PRECISION,
                KEEP_UNSEEN=True, WIDE_OFFSETS=True,
            )  # fmt: skip
            tl.store(O_part + r[:, None] * so_r + s * so_s + h * so_h + offs_d[None, :],
                     out, mask=row_ok[:, None])  # fmt: skip
            tl.store(LSE_part + r * sl_r + s * sl_s + h, lse, mask=row_ok)

    @triton.jit(do_not_specialize=["num_q", "num_alloc"])  # type: ignore[untyped-decorator]
    def _fixed_combine_kernel(  # type: ignore[no-untyped-def]
        O_part, LSE_part, Out, Start, SeqLen, num_q, num_alloc,
        so_r, so_s, so_h, sl_r, sl_s, sout_r, sout_h,
        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT: tl.constexpr,
        NUM_SPLITS: tl.constexpr,
    ):  # fmt: skip
        """Merge one (row, head)'s NUM_SPLITS partials in one fixed tree; splits that
        were not written load as LSE -inf and output 0 (weight exactly 0)."""
        r = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        b = r // num_q
        first = ((r % num_q) // BLOCK_M) * BLOCK_M
        start = tl.load(Start + b).to(tl.int32)
        limit = tl.minimum(tl.load(SeqLen + b).to(tl.int32), start + first + BLOCK_M)
        offs_s = tl.arange(0, NUM_SPLITS)
        offs_d = tl.arange(0, HEAD_DIM)
        written = (offs_s < num_alloc) & (offs_s * SPLIT < limit)  # [NS]
        lse = tl.load(LSE_part + r * sl_r + offs_s * sl_s + h, mask=written,
                      other=float("-inf"))  # [NS]
        parts = tl.load(O_part + r * so_r + offs_s[:, None] * so_s + h * so_h
                        + offs_d[None, :], mask=written[:, None], other=0.0)  # [NS, D]
        out = merge_splits(lse, parts, EMPTY_SAFE=True)  # [D]; empty splits weigh 0
        tl.store(Out + r * sout_r + h * sout_h + offs_d, out.to(Out.dtype.element_ty))


def _need_cuda(name: str, *tensors: torch.Tensor) -> None:
    if not HAVE_TRITON or any(t.device.type != "cuda" for t in tensors):
        raise InvalidInput(f"{name} needs a CUDA device and Triton")


def invariant_mm(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    accumulate_into: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: MmConfig | None = None,
) -> torch.Tensor:
    """``x [M, K] @ w [N, K].T -> [M, N]`` with one tile per weight shape (batch-invariant).

    ``accumulate_into`` [M, N]: add the product to it in place (like ``addmm_``; the
    sum is rounded once, from fp32) and return it. ``out`` [M, N]: write there. Both
    must be row-major and not overlap ``x``. ``config`` overrides :func:`.invariant_tiles.mm_config`
    (the benchmark's candidates; the engine never passes it). float32 runs in IEEE
    fp32 (no TF32), so the toy model's fp32 path stays fp32.
    """
    _need_cuda("invariant_mm", x, w)
    m, k = x.shape
    n = w.shape[0]
    if w.shape[1] != k or w.dtype != x.dtype or w.stride(1) != 1:
        raise InvalidInput(f"invariant_mm: x {list(x.shape)} {x.dtype} and w {list(w.shape)} "
                           f"{w.dtype} (unit stride on K) do not fit")
    dest = accumulate_into if accumulate_into is not None else out
    if dest is None:
        dest = x.new_empty((m, n))  # [M, N]
    if tuple(dest.shape) != (m, n) or dest.dtype != x.dtype or not dest.is_contiguous():
        raise InvalidInput(f"invariant_mm: the output must be a row-major [{m}, {n}] {x.dtype}")
    x = x.contiguous()
    if dest.data_ptr() == x.data_ptr():
        raise InvalidInput("invariant_mm: the output overlaps the input")
    if m == 0:
        return dest
    c = config or mm_config(n, k, m, x.dtype)
    if c.persistent and x.dtype != torch.float32 and tma_available(x.device):
        return persistent_invariant_mm(x, w, dest, c, accumulate=accumulate_into is not None)
    grid, meta = mm_launch(m, n, k, x.dtype, accumulate=accumulate_into is not None,
                           config=c)  # fmt: skip
    kernel: Any = _invariant_mm_kernel
    kernel[grid](x, w, dest, m, n, k, w.stride(0), **meta)
    return dest


def fixed_split_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    split: int = SPLIT,
    query_tile: int = QUERY_TILE,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Split-KV attention with fixed-size splits; the contract of
    :func:`.attention.reference_attention`, and batch-invariant (module docstring).

    q: [Bp, Q, H, D]; k_cache, v_cache: [S, Hkv, T, D] (unit stride on D); slots,
    starts, seq_lens: [Bp] integer tensors on the device. Returns [Bp, Q, H, D] in q's
    dtype (into ``out`` when given, row-major). Lengths are read on the device: no host
    synchronisation, so the launch is CUDA-graph safe.
    """
    _need_cuda("fixed_split_attention", q, k_cache, v_cache)
    if split < ATTN_BLOCK_N or split % ATTN_BLOCK_N:
        raise InvalidInput(f"the split ({split}) must be a multiple of {ATTN_BLOCK_N}")
    bp, nq, nh, hd = q.shape
    t = k_cache.shape[2]
    if nh % k_cache.shape[1] or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise InvalidInput(f"q {list(q.shape)} does not fit the cache {list(k_cache.shape)}")
    q = q.contiguous()
    if out is None:
        out = torch.empty_like(q)  # [Bp, Q, H, D]
    if tuple(out.shape) != tuple(q.shape) or not out.is_contiguous():
        raise InvalidInput(f"the output must be a row-major {list(q.shape)}")
    if bp * nq == 0:
        return out
    launch = attention_launch(bp, nq, nh, hd, k_cache.shape[1], t, q.dtype, split,
                              query_tile)
    num_alloc, q_tiles = launch.num_alloc, launch.q_tiles
    o_part = torch.empty((bp * nq, num_alloc, nh, hd), device=q.device,
                         dtype=torch.float32)  # [B Q, splits, H, D]
    lse = torch.empty((bp * nq, num_alloc, nh), device=q.device,
                      dtype=torch.float32)  # [B Q, splits, H]
    qk_scale = hd**-0.5 * 1.4426950408889634  # softmax scale in log2 units (exp2)
    kernel: Any = _fixed_split_kernel
    kernel[launch.grid](
        q, k_cache, v_cache, o_part, lse, slots, starts, seq_lens, nq, q_tiles,
        nh * hd, hd,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse.stride(0), lse.stride(1), qk_scale, **launch.meta,
    )  # fmt: skip
    _combine(o_part, lse, out, starts, seq_lens, nq, launch)
    return out


def _combine(o_part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, starts: torch.Tensor,
             seq_lens: torch.Tensor, nq: int, launch: AttentionLaunch) -> None:
    """The splits' partials [B Q, splits, H, D] merged into out [B, Q, H, D]."""
    nh, hd = out.shape[2], out.shape[3]
    combine: Any = _fixed_combine_kernel
    combine[launch.combine_grid](
        o_part, lse, out, starts, seq_lens, nq, launch.num_alloc,
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse.stride(0), lse.stride(1), nh * hd, hd, **launch.combine_meta,
    )  # fmt: skip


def prefill_fixed_split_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tiles: PrefillTiles,
    *,
    split: int = SPLIT,
) -> torch.Tensor:
    """Causal attention of prompt pieces through :func:`fixed_split_attention`.

    q: [M, H, D], the pieces' queries concatenated (their K/V already in the cache);
    ``tiles`` from :func:`.invariant_tiles.prefill_tiles`. Each pseudo-session is a 16-query "verify
    step" (the last one padded with zero queries, whose outputs are dropped), so a
    prompt row gets exactly the bits a step at its position would. Returns [M, H, D].
    """
    _, nh, hd = q.shape
    p = tiles.slots.shape[0]
    tile = tiles.tile
    padded = q.new_zeros((p * tile, nh, hd))  # [P tile, H, D]
    padded.index_copy_(0, tiles.rows, q)
    if tiles.groups is None:
        o = fixed_split_attention(padded.view(p, tile, nh, hd), k_cache, v_cache,
                                  tiles.slots, tiles.starts, tiles.seq_lens, split=split,
                                  query_tile=tile)
        return o.view(p * tile, nh, hd).index_select(0, tiles.rows)  # [M, H, D]
    _need_cuda("prefill_fixed_split_attention", q, k_cache, v_cache)
    launch = attention_launch(p, tile, nh, hd, k_cache.shape[1], k_cache.shape[2], q.dtype,
                              split, tile)
    o_part = torch.empty((p * tile, launch.num_alloc, nh, hd), device=q.device,
                         dtype=torch.float32)  # [P tile, splits, H, D]
    lse = torch.empty((p * tile, launch.num_alloc, nh), device=q.device,
                      dtype=torch.float32)  # [P tile, splits, H]
    grouped_prompt_splits(padded, k_cache, v_cache, tiles, launch, o_part, lse,
                          hd**-0.5 * 1.4426950408889634)
    out = torch.empty((p, tile, nh, hd), device=q.device, dtype=q.dtype)  # [P, tile, H, D]
    _combine(o_part, lse, out, tiles.starts, tiles.seq_lens, tile, launch)
    return out.view(p * tile, nh, hd).index_select(0, tiles.rows)  # [M, H, D]


def all_dense(weights: LanguageWeights) -> bool:
    """Whether every layer's linear weights are dense tensors (not int8/int4): the
    kernels here take dense weights only; quantised ones keep the plain invariant path."""
    return all(isinstance(m, torch.Tensor) for lw in weights.layers
               for m in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down))


def dense_invariant_linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """:func:`invariant_mm` as a ``layers.Linear`` (dense weights, :func:`all_dense`)."""
    assert isinstance(w, torch.Tensor)
    return invariant_mm(x, w)


def dense_invariant_linear_add_(h: torch.Tensor, x: torch.Tensor, w: Weight) -> torch.Tensor:
    """``h += x @ w.T`` in place through the invariant GEMM's epilogue."""
    assert isinstance(w, torch.Tensor)
    return invariant_mm(x, w, accumulate_into=h)
