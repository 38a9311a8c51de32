"""A prompt's batch-invariant attention, four 16-query pseudo-sessions per program.

Why: a prompt row must get the bits a decode or verify step at its position would
(:mod:`.invariant_kernels`), so a prompt is cut into 16-query pseudo-sessions that run
the step's split kernel, one program per (pseudo-session, head, split). Each program
then loads its split's keys and values for 16 queries only, and a 2,100-token prompt
took 0.47 ms a layer against flash attention's 0.093 on an H200 (issue 39 item 3).
Running 64 queries per tile instead changes the MMA (wgmma for 64 rows, mma for 16)
and with it the bits (``invariant-cross-tiles-h200.json``: ``equal_to_tile16`` false).

Here one program runs :data:`.invariant_tiles.PROMPT_GROUP` consecutive pseudo-sessions
of one slot: each key block is loaded once, and each pseudo-session's 16 queries go
through :func:`.split_softmax.online_softmax_step` on it, the same [16, D] dots and
the same update as the step's kernel, so each row's arithmetic is unchanged. The
block range is the group's (up to its last pseudo-session's end); a block past one
pseudo-session's queries is masked for them (scores -inf, weights exactly +0) and
leaves their running state untouched, as blocks past a query already do inside one
pseudo-session. Each pseudo-session's partial output is written where the step's
kernel writes it, so the step's combine finishes them unchanged. ``make test-gpu``
checks prompt rows against decode and verify rows bitwise; ``python -m
benchmarks.probe_invariant_persistent`` does too, and times it.
"""

from __future__ import annotations

from typing import Any

import torch

from eventspec.shared.node.static.attention import HAVE_TRITON
from eventspec.shared.node.static.invariant_tiles import (
    PROMPT_GROUP,
    AttentionLaunch,
    PrefillTiles,
)

__all__ = ["grouped_prompt_splits"]

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from eventspec.shared.node.static.split_softmax import finish_split, online_softmax_step

    @triton.jit  # type: ignore[untyped-decorator]
    def _load_q(Q, t, h, sq_r, sq_h, BLOCK_M: tl.constexpr,  # type: ignore[no-untyped-def]
                HEAD_DIM: tl.constexpr):
        """Pseudo-session t's queries of head h, [BM, D] (rows t BM ..)."""
        r = (t * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        return tl.load(Q + r[:, None] * sq_r + h * sq_h + tl.arange(0, HEAD_DIM)[None, :])

    @triton.jit  # type: ignore[untyped-decorator]
    def _store_part(O_part, LSE_part, t, h, s, out, lse,  # type: ignore[no-untyped-def]
                    so_r, so_s, so_h, sl_r, sl_s, BLOCK_M: tl.constexpr,
                    HEAD_DIM: tl.constexpr):
        """Pseudo-session t's partial (output, LSE) of split s, where the step's kernel
        writes a session's."""
        r = (t * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        offs_d = tl.arange(0, HEAD_DIM)
        tl.store(O_part + r[:, None] * so_r + s * so_s + h * so_h + offs_d[None, :], out)
        tl.store(LSE_part + r * sl_r + s * sl_s + h, lse)

    @triton.jit  # type: ignore[untyped-decorator]
    def _grouped_split_kernel(  # type: ignore[no-untyped-def]
        Q, K, V, O_part, LSE_part, Groups, Slot, Start, SeqLen,
        sq_r, sq_h, sk_s, sk_h, sk_t, sv_s, sv_h, sv_t,
        so_r, so_s, so_h, sl_r, sl_s, qk_scale,
        GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        """One (group of 4 pseudo-sessions, head, split); a pseudo-session of -1, or
        one wholly before the split, is skipped."""
        g = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        s = tl.program_id(2)
        lo = s * SPLIT
        t0 = tl.load(Groups + g * 4)
        t1 = tl.load(Groups + g * 4 + 1)
        t2 = tl.load(Groups + g * 4 + 2)
        t3 = tl.load(Groups + g * 4 + 3)
        # Each pseudo-session's reach, as the step's kernel computes a tile's (its
        # first query row is row 0): min(seq_len, start + BLOCK_M); 0 when absent.
        lim0 = tl.minimum(tl.load(SeqLen + t0), tl.load(Start + t0) + BLOCK_M).to(tl.int32)
        lim1 = tl.where(t1 >= 0, tl.minimum(tl.load(SeqLen + t1, mask=t1 >= 0, other=0),
                                            tl.load(Start + t1, mask=t1 >= 0, other=0)
                                            + BLOCK_M), 0).to(tl.int32)
        lim2 = tl.where(t2 >= 0, tl.minimum(tl.load(SeqLen + t2, mask=t2 >= 0, other=0),
                                            tl.load(Start + t2, mask=t2 >= 0, other=0)
                                            + BLOCK_M), 0).to(tl.int32)
        lim3 = tl.where(t3 >= 0, tl.minimum(tl.load(SeqLen + t3, mask=t3 >= 0, other=0),
                                            tl.load(Start + t3, mask=t3 >= 0, other=0)
                                            + BLOCK_M), 0).to(tl.int32)
        limit = tl.maximum(tl.maximum(lim0, lim1), tl.maximum(lim2, lim3))
        if lo < limit:
            slot = tl.load(Slot + t0).to(tl.int64)
            kvh = h // GROUPS
            k_base = K + slot * sk_s + kvh * sk_h
            v_base = V + slot * sv_s + kvh * sv_h
            offs_m = tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, HEAD_DIM)
            offs_n = tl.arange(0, BLOCK_N)
            # Absent pseudo-sessions run on row 0's queries at position -1: they see no
            # key, so their state stays empty, and nothing of theirs is stored.
            q0 = _load_q(Q, t0, h, sq_r, sq_h, BLOCK_M, HEAD_DIM)
            q1 = _load_q(Q, tl.maximum(t1, 0), h, sq_r, sq_h, BLOCK_M, HEAD_DIM)
            q2 = _load_q(Q, tl.maximum(t2, 0), h, sq_r, sq_h, BLOCK_M, HEAD_DIM)
            q3 = _load_q(Q, tl.maximum(t3, 0), h, sq_r, sq_h, BLOCK_M, HEAD_DIM)
            p0 = tl.load(Start + t0).to(tl.int32) + offs_m
            p1 = tl.where(t1 >= 0, tl.load(Start + tl.maximum(t1, 0)).to(tl.int32) + offs_m, -1)
            p2 = tl.where(t2 >= 0, tl.load(Start + tl.maximum(t2, 0)).to(tl.int32) + offs_m, -1)
            p3 = tl.where(t3 >= 0, tl.load(Start + tl.maximum(t3, 0)).to(tl.int32) + offs_m, -1)
            m0 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            m1 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            m2 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            m3 = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l0 = tl.zeros([BLOCK_M], dtype=tl.float32)
            l1 = tl.zeros([BLOCK_M], dtype=tl.float32)
            l2 = tl.zeros([BLOCK_M], dtype=tl.float32)
            l3 = tl.zeros([BLOCK_M], dtype=tl.float32)
            a0 = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
            a1 = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
            a2 = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
            a3 = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
            hi = tl.minimum(lo + SPLIT, limit)
            for n0 in range(lo, hi, BLOCK_N):
                kv = n0 + offs_n  # [BN] key positions
                in_len = kv < hi
                rows = kv[:, None].to(tl.int64)
                k = tl.load(k_base + rows * sk_t + offs_d[None, :], mask=in_len[:, None],
                            other=0.0)  # [BN, D]
                v = tl.load(v_base + rows * sv_t + offs_d[None, :], mask=in_len[:, None],
                            other=0.0)  # [BN, D]
                m0, l0, a0 = online_softmax_step(q0, k, v, kv, in_len, p0, qk_scale, m0, l0,
                                                 a0, PRECISION, True)
                m1, l1, a1 = online_softmax_step(q1, k, v, kv, in_len, p1, qk_scale, m1, l1,
                                                 a1, PRECISION, True)
                m2, l2, a2 = online_softmax_step(q2, k, v, kv, in_len, p2, qk_scale, m2, l2,
                                                 a2, PRECISION, True)
                m3, l3, a3 = online_softmax_step(q3, k, v, kv, in_len, p3, qk_scale, m3, l3,
                                                 a3, PRECISION, True)
            if lo < lim0:
                out, lse = finish_split(m0, l0, a0)
                _store_part(O_part, LSE_part, t0, h, s, out, lse, so_r, so_s, so_h, sl_r,
                            sl_s, BLOCK_M, HEAD_DIM)
            if lo < lim1:
                out, lse = finish_split(m1, l1, a1)
                _store_part(O_part, LSE_part, t1, h, s, out, lse, so_r, so_s, so_h, sl_r,
                            sl_s, BLOCK_M, HEAD_DIM)
            if lo < lim2:
                out, lse = finish_split(m2, l2, a2)
                _store_part(O_part, LSE_part, t2, h, s, out, lse, so_r, so_s, so_h, sl_r,
                            sl_s, BLOCK_M, HEAD_DIM)
            if lo < lim3:
                out, lse = finish_split(m3, l3, a3)
                _store_part(O_part, LSE_part, t3, h, s, out, lse, so_r, so_s, so_h, sl_r,
                            sl_s, BLOCK_M, HEAD_DIM)


def grouped_prompt_splits(
    padded: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tiles: PrefillTiles,
    launch: AttentionLaunch, o_part: torch.Tensor, lse: torch.Tensor, qk_scale: float,
) -> None:
    """The split phase of a prompt's attention into ``o_part`` [P 16, splits, H, D] and
    ``lse`` [P 16, splits, H] (float32), as the step's split kernel would write them for
    the pseudo-sessions of ``tiles``; padded: the queries [P 16, H, D] in pseudo-session
    rows. The caller runs the step's combine after it."""
    assert tiles.groups is not None and tiles.groups.shape[1] == PROMPT_GROUP == 4
    nh, hd = padded.shape[1], padded.shape[2]
    grid = (tiles.groups.shape[0], launch.grid[1], launch.grid[2])
    kernel: Any = _grouped_split_kernel
    kernel[grid](
        padded, k_cache, v_cache, o_part, lse, tiles.groups, tiles.slots, tiles.starts,
        tiles.seq_lens, nh * hd, hd,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse.stride(0), lse.stride(1), qk_scale, **launch.meta,
    )  # fmt: skip
