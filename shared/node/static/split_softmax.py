"""Split-KV attention's two pieces of arithmetic, written once (Triton device functions).

Both split-KV kernels, :mod:`.attention`'s (the default path: a split *count* chosen
from the batch) and :mod:`.invariant_kernels`' (``--batch-invariant``: a fixed split
*size*), run the same FlashDecoding scheme (Dao et al., "Flash-Decoding for long-context
inference", 2023): each program walks one split of a session's keys with an online
softmax, and a second kernel merges the splits' partial outputs by their log-sum-exp.
Where the splits lie, which queries a program holds, how the partials are laid out and
which of them a combine reads are each kernel's own; the arithmetic is here:

- :func:`online_softmax_split`: the loop over one split's keys in blocks of ``BLOCK_N``
  (scores in log2 units, masked to the keys each query may see, running max, sum and
  output in fp32) and the split's normalised output and LSE; its body and ending are
  :func:`online_softmax_step` and :func:`finish_split`, which the prompt kernel of
  :mod:`.invariant_prompt` runs for four query tiles on one load of each key block;
- :func:`merge_splits`: one (row, head)'s partials weighted by ``exp2(lse - max)``.

Four switches are compile-time arguments, so each kernel compiles to the arithmetic it
had when it held its own copy (the batch-invariant kernel's bits, and why they do not
follow the batch, are argued in :mod:`.invariant_kernels`):

- ``PRECISION``: ``tl.dot``'s input precision, ``"default"`` for Triton's own default
  (the split-count kernel passes no precision; the fixed-split one passes
  :func:`.invariant_tiles.dot_precision`'s, IEEE for float32);
- ``KEEP_UNSEEN``: a block with no key a query sees leaves that query's running state
  as it was, by a per-row select (the fixed-split kernel: so how far a split's loop
  runs changes no bit); without it the same update runs on every row, which adds
  exact zeros there up to the sign of a zero;
- ``WIDE_OFFSETS``: key rows addressed in int64 (the fixed-split kernel), else in the
  index type (addresses only, no value changes);
- ``EMPTY_SAFE`` (:func:`merge_splits`): a row whose every split is empty (LSE -inf)
  gets 0 instead of 0 / 0 (the fixed-split combine, which masks splits never written).

Importable without Triton (CPU installs): the functions exist only where it does.
"""

from __future__ import annotations

__all__ = ["HAVE_TRITON", "finish_split", "merge_splits", "online_softmax_split",
           "online_softmax_step"]

try:  # Triton exists where CUDA does; CPU-only installs never call these.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False


if HAVE_TRITON:

    @triton.jit  # type: ignore[untyped-decorator]
    def _dot(a, b, PRECISION: tl.constexpr):  # type: ignore[no-untyped-def]
        """``tl.dot(a, b)`` at ``PRECISION`` ("default": the call without one)."""
        if PRECISION == "default":  # noqa: SIM108 (a static if: one branch compiles)
            r = tl.dot(a, b)
        else:
            r = tl.dot(a, b, input_precision=PRECISION)
        return r

    @triton.jit  # type: ignore[untyped-decorator]
    def online_softmax_step(  # type: ignore[no-untyped-def]
        q, k, v, kv, in_len, q_pos, qk_scale, m_i, l_i, acc,
        PRECISION: tl.constexpr, KEEP_UNSEEN: tl.constexpr,
    ):  # fmt: skip
        """One block of keys k, v [BN, D] (positions kv [BN], ``in_len`` the ones in
        range) into queries q [BM, D]'s running (max m_i [BM], sum l_i [BM], output
        acc [BM, D]); a key is seen by the queries at or after it. Returns the new
        (m_i, l_i, acc)."""
        scores = _dot(q, tl.trans(k), PRECISION) * qk_scale  # [BM, BN], log2 units
        ok = in_len[None, :] & (kv[None, :] <= q_pos[:, None])  # [BM, BN]
        scores = tl.where(ok, scores, float("-inf"))
        m_blk = tl.max(scores, 1)  # [BM]
        seen = m_blk > float("-inf")  # [BM] rows that see a key of this block
        m_new = tl.maximum(m_i, m_blk)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_safe[:, None])  # [BM, BN]; masked keys: +0
        alpha = tl.exp2(m_i - m_safe)  # [BM]
        # The running state's update, in each kernel's own order of operations.
        if KEEP_UNSEEN:
            pv = _dot(p.to(v.dtype), v, PRECISION)  # [BM, D]
            l_i = tl.where(seen, l_i * alpha + tl.sum(p, 1), l_i)
            acc = tl.where(seen[:, None], acc * alpha[:, None] + pv, acc)
            m_i = tl.where(seen, m_new, m_i)
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION)
            m_i = m_new
        return m_i, l_i, acc

    @triton.jit
    def finish_split(m_i, l_i, acc):  # type: ignore[no-untyped-def]
        """(output [BM, D] normalised, LSE [BM] in log2 units) of a split's running
        state; -inf and 0 for a query that saw no key."""
        has = l_i > 0.0
        out = acc / tl.where(has, l_i, 1.0)[:, None]  # [BM, D]
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        return out, lse

    @triton.jit  # type: ignore[untyped-decorator]
    def online_softmax_split(  # type: ignore[no-untyped-def]
        q, k_base, v_base, sk_t, sv_t, lo, hi, q_pos, qk_scale,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
        PRECISION: tl.constexpr, KEEP_UNSEEN: tl.constexpr, WIDE_OFFSETS: tl.constexpr,
    ):  # fmt: skip
        """Online softmax of queries q [BM, D] (at positions q_pos [BM]) over keys
        [lo, hi) of one head (key p at ``k_base + p * sk_t``, values likewise), in
        blocks of BLOCK_N from lo (:func:`online_softmax_step`). Returns (output [BM, D]
        fp32 normalised, LSE [BM] in log2 units; -inf and 0 for a query that saw no
        key)."""
        offs_d = tl.arange(0, HEAD_DIM)
        offs_n = tl.arange(0, BLOCK_N)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        for n0 in range(lo, hi, BLOCK_N):
            kv = n0 + offs_n  # [BN] key positions
            in_len = kv < hi
            if WIDE_OFFSETS:  # noqa: SIM108 (a static if: one branch compiles)
                rows = kv[:, None].to(tl.int64)
            else:
                rows = kv[:, None]
            k = tl.load(k_base + rows * sk_t + offs_d[None, :],
                        mask=in_len[:, None], other=0.0)  # [BN, D]
            v = tl.load(v_base + rows * sv_t + offs_d[None, :],
                        mask=in_len[:, None], other=0.0)  # [BN, D]
            m_i, l_i, acc = online_softmax_step(q, k, v, kv, in_len, q_pos, qk_scale, m_i,
                                                l_i, acc, PRECISION, KEEP_UNSEEN)
        return finish_split(m_i, l_i, acc)

    @triton.jit  # type: ignore[untyped-decorator]
    def merge_splits(lse, parts, EMPTY_SAFE: tl.constexpr):  # type: ignore[no-untyped-def]
        """One (row, head)'s output [D] from its splits' LSE [NS] and partial outputs
        [NS, D]: weights ``exp2(lse - max)``, an empty split (LSE -inf) weighing 0."""
        top = tl.max(lse, 0)
        if EMPTY_SAFE:
            top = tl.where(top == float("-inf"), 0.0, top)
        w = tl.exp2(lse - top)  # [NS]
        num = tl.sum(parts * w[:, None], 0)  # [D]
        den = tl.sum(w, 0)
        if EMPTY_SAFE:
            den = tl.where(den > 0.0, den, 1.0)
        return num / den
