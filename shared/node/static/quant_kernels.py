"""The int8 weight-only matmul of the static runtime's CUDA path (Triton).

``out[M, N] = x[M, K] @ (q[N, K] * s[N]).T`` for the few rows a draft or verify step
has (M <= 16 after bucketing; larger M is tiled too). The int8 tile is widened to the
activations' dtype in registers and fed to ``tl.dot``; the per-row scale is applied
once to the fp32 accumulator, so the result is the dense matmul with the dequantised
weight up to accumulation order. Each program owns a BLOCK_N stripe of outputs and
walks all of K (no split-K: deterministic, and at 7B widths there are enough stripes
to fill the GPU). ``accumulate_into`` adds the product to a residual in place, as
``addmm_`` does for the dense path.

Why not core's ``_weight_int8pack_mm`` on CUDA: it computes one output per thread and
took 55 ms for a 7B decoder's linear layers at M = 1 on an H100 (bf16: 5.2 ms;
``python -m benchmarks.probe_quant_kernels``).
"""

from __future__ import annotations

from typing import Any

import torch

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.attention import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.autotune(  # type: ignore[untyped-decorator]
        configs=[
            triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
            for bn, bk, w, s in (
                (32, 256, 4, 4), (64, 128, 4, 4), (64, 256, 4, 3),
                (32, 512, 4, 3), (128, 128, 4, 3), (16, 512, 4, 4),
            )
        ],
        key=["M_BUCKET", "N", "K"],
        restore_value=["Out"],  # the autotuner's trial runs must not accumulate twice
    )
    @triton.jit  # type: ignore[untyped-decorator]
    def _int8_wo_kernel(  # type: ignore[no-untyped-def]
        X, Q, S, Out, M, N, K, s_xm, s_qn, s_om, M_BUCKET,
        ACCUMULATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        """One BLOCK_M x BLOCK_N tile of the output, over all of K. ``M_BUCKET`` (M
        rounded up to a power of two) only keys the autotuner, so a prefill of a new
        length reuses the tuning of its bucket."""
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
        offs_k = tl.arange(0, BLOCK_K)  # [BK]
        m_ok = offs_m < M
        n_ok = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = (k0 + offs_k) < K
            x = tl.load(
                X + offs_m[:, None].to(tl.int64) * s_xm + (k0 + offs_k)[None, :],
                mask=m_ok[:, None] & k_ok[None, :], other=0.0,
            )  # [BM, BK]
            q = tl.load(
                Q + offs_n[None, :].to(tl.int64) * s_qn + (k0 + offs_k)[:, None],
                mask=n_ok[None, :] & k_ok[:, None], other=0,
            )  # [BK, BN] int8
            acc += tl.dot(x, q.to(x.dtype))
        scale = tl.load(S + offs_n, mask=n_ok, other=0.0).to(tl.float32)  # [BN]
        acc = acc * scale[None, :]
        dst = Out + offs_m[:, None].to(tl.int64) * s_om + offs_n[None, :]
        mask = m_ok[:, None] & n_ok[None, :]
        if ACCUMULATE:
            acc += tl.load(dst, mask=mask, other=0.0).to(tl.float32)
        tl.store(dst, acc.to(Out.dtype.element_ty), mask=mask)


def int8_weight_mm(
    x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
    *, accumulate_into: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (bf16/fp16) @ (q [N, K] int8 * scales [N]).T -> [M, N], or added into
    ``accumulate_into`` [M, N] (returned)."""
    if not HAVE_TRITON or x.device.type != "cuda":
        raise InvalidInput("the int8 Triton kernel needs a CUDA device and Triton")
    m, k = x.shape
    n = q.shape[0]
    if q.shape[1] != k or q.dtype != torch.int8 or scales.shape != (n,):
        raise InvalidInput(
            f"int8 matmul: x {list(x.shape)}, q {list(q.shape)} {q.dtype}, scales "
            f"{list(scales.shape)} do not fit"
        )
    x = x.contiguous()
    out = accumulate_into if accumulate_into is not None else x.new_empty(m, n)
    block_m = 16 if m <= 16 else 64
    m_bucket = 1 << max(m - 1, 0).bit_length()

    def grid(meta: dict[str, Any]) -> tuple[int, int]:
        return triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(m, block_m)

    _int8_wo_kernel[grid](
        x, q, scales, out, m, n, k, x.stride(0), q.stride(0), out.stride(0), m_bucket,
        ACCUMULATE=accumulate_into is not None, BLOCK_M=block_m,
    )
    return out
