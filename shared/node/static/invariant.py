"""Batch-invariant arithmetic for the static runtime (``--batch-invariant``).

Why: a greedy speculative answer is Video-LLaVA's own only if every logit a session
sees is the same bits whoever else is in the batch, however many drafts it verifies
and wherever it sits in the step. Library GEMMs and attention pick their blocking,
split-K and KV splits from the whole call's shape, so a row's rounding depends on the
batch (He et al., "Defeating Nondeterminism in LLM Inference", Thinking Machines
2025; SGLang's deterministic mode is built on their kernels). Here each operation's
result for a row depends on that row alone:

- **Linear layers** run in fixed tiles of ``ROW_TILE`` rows (the last padded), so every
  library call has the same shape and each row meets the same kernel and reduction
  order whatever M is.
- **RMSNorm** runs in the same fixed tiles (a library reduction may split a long row
  across threads when few rows are given).
- **Attention** reads keys in fixed splits of ``KV_SPLIT`` positions counted from
  position 0 (a fixed split *size*, not a fixed number of splits) and merges the
  splits' partial softmaxes in order. A split beyond a query's causal limit adds an
  exact zero, so a query gives the same bits alone, in a batch, inside a (k + 1)-token
  verify step or a prefill chunk. Its sums (over the head dimension for a score, over a
  split's positions for the weights and the weighted values) are explicit sequential
  additions of elementwise terms, never a batched GEMM or a library reduction whose
  strategy follows the batch's shape.
- RoPE, SiLU and the embedding are elementwise or per row already.

This is the reference implementation, in plain torch, checked bitwise on CPU
(``tests/unit/cloud/test_batch_invariant.py``), and the path wherever the Triton
kernels are not used (CPU, CUDA without Triton, int8/int4 weights): there it runs
unfused and without graphs. On CUDA with Triton the runtime uses
:mod:`.invariant_kernels` instead (a Triton GEMM with one tile per weight shape and no
split-K, split-KV attention with a fixed split size, CUDA graphs on); those kernels
compute the same functions with their own fixed orders, so their bits are not this
module's. Neither path's GPU speed has been measured yet.
"""

from __future__ import annotations

import torch

from eventspec.shared.node.static.layers import rms_norm
from eventspec.shared.node.static.quant import Weight, linear

#: Rows per linear-layer call.
ROW_TILE = 16
#: Key positions per attention split.
KV_SPLIT = 64


def invariant_linear(x: torch.Tensor, w: Weight) -> torch.Tensor:
    """``linear(x, w)`` in fixed tiles of ``ROW_TILE`` rows. x: [M, K] -> [M, N]."""
    m = x.shape[0]
    pad = (-m) % ROW_TILE
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])  # [M + pad, K]
    tiles = [linear(x[i : i + ROW_TILE], w) for i in range(0, x.shape[0], ROW_TILE)]
    return torch.cat(tiles)[:m]  # [M, N]


def invariant_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``layers.rms_norm`` in fixed tiles of ``ROW_TILE`` rows. x: [M, H]."""
    m = x.shape[0]
    pad = (-m) % ROW_TILE
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])  # [M + pad, H]
    tiles = [rms_norm(x[i : i + ROW_TILE], weight, eps) for i in range(0, x.shape[0], ROW_TILE)]
    return torch.cat(tiles)[:m]  # [M, H]


def _sum_in_order(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x.sum(dim)`` as additions in index order, whatever the other dimensions."""
    parts = x.unbind(dim)
    out = parts[0].clone()
    for part in parts[1:]:
        out += part
    return out


def invariant_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    q_pos: torch.Tensor,
) -> torch.Tensor:
    """Causal attention of each query over its slot's positions 0 .. its own.

    q: [B, Q, Hq, D]; k_cache, v_cache: [S, Hkv, T, D]; slots: [B]; q_pos: [B, Q] the
    position of each query (a padded query may name any position: its row is garbage,
    as in the other paths). Returns [B, Q, Hq, D] in q's dtype.
    """
    b, nq, hq, d = q.shape
    hkv, t = k_cache.shape[1], k_cache.shape[2]
    group = hq // hkv
    last = int(q_pos.max()) + 1 if q_pos.numel() else 1
    qf = q.float().view(b, nq, hkv, group, d) * d**-0.5  # [B, Q, Hkv, G, D]
    m = torch.full((b, nq, hkv, group), float("-inf"), device=q.device)
    l_sum = torch.zeros((b, nq, hkv, group), device=q.device)
    acc = torch.zeros((b, nq, hkv, group, d), device=q.device)
    for lo in range(0, min(last, t), KV_SPLIT):
        hi = min(lo + KV_SPLIT, t)
        k = k_cache[:, :, lo:hi].index_select(0, slots).float()  # [B, Hkv, s, D]
        v = v_cache[:, :, lo:hi].index_select(0, slots).float()  # [B, Hkv, s, D]
        k = k.permute(0, 2, 1, 3)[:, None, :, :, None, :]  # [B, 1, s, Hkv, 1, D]
        v = v.permute(0, 2, 1, 3)[:, None, :, :, None, :]  # [B, 1, s, Hkv, 1, D]
        scores = _sum_in_order(qf[:, :, None] * k, -1)  # [B, Q, s, Hkv, G]
        pos = torch.arange(lo, hi, device=q.device)  # [s]
        visible = pos[None, None, :] <= q_pos[:, :, None]  # [B, Q, s]
        scores = scores.masked_fill(~visible[..., None, None], float("-inf"))
        m_split = scores.amax(2)  # [B, Q, Hkv, G]
        m_new = torch.maximum(m, m_split)
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(scores - safe[:, :, None])  # [B, Q, s, Hkv, G]
        scale = torch.exp(m - safe)  # [B, Q, Hkv, G]
        l_sum = l_sum * scale + _sum_in_order(p, 2)
        acc = acc * scale[..., None] + _sum_in_order(p[..., None] * v, 2)  # [B,Q,Hkv,G,D]
        m = m_new
    out = acc / l_sum.clamp_min(torch.finfo(torch.float32).tiny)[..., None]
    return out.view(b, nq, hq, d).to(q.dtype)  # [B, Q, Hq, D]
