"""The fp8 prefill's activation quantisation in one pass (Triton, CUDA).

:func:`.fp8.quantize_rows` in torch is five element-wise passes over a [M, K] float32
copy of the activations (the cast, abs, amax, divide, clamp and cast back); at a
2,103-token prompt those cost more than the fp8 GEMMs saved: an H200 prefill took 58.6
ms in fp8 against 53.2 in bf16 with them (``fp8-prefill-full-h200-torch-quant.json``),
and 39.5 against 51.6 with this kernel (``fp8-prefill-full-h200.json``).
This kernel reads each row once into registers, takes its absolute maximum, and writes
the E4M3 row and its float32 scale: one read of the bf16 row, one write of one byte
per value. Its scales are the torch version's arithmetic (the row maximum times
float32 1 / 448) and its E4M3 codes equal torch's but for rare ties that Triton's
conversion rounds to the neighbouring code (``tests/gpu/test_fp8_prefill_cuda.py``
bounds both: the scales within one float32 rounding, the codes one step).
"""

from __future__ import annotations

import torch

from eventspec.shared.node.static.attention import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def _quantize_rows_kernel(  # type: ignore[no-untyped-def]
        X, Q, S, K, s_x, s_q, FP8_MAX: tl.constexpr, INV_FP8_MAX: tl.constexpr,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        """One row: its absolute maximum, then every value divided by max / FP8_MAX."""
        m = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        x = tl.load(X + m * s_x + offs, mask=offs < K, other=0.0).to(tl.float32)
        # The scale as torch makes it (a float32 product with 1 / FP8_MAX: torch on CUDA
        # divides by a scalar that way); the values by IEEE division (Triton's "/" is
        # the fast approximate one).
        scale = tl.maximum(tl.max(tl.abs(x), axis=0) * INV_FP8_MAX, 1e-12)
        q = tl.minimum(tl.maximum(tl.div_rn(x, scale), -FP8_MAX), FP8_MAX)
        tl.store(Q + m * s_q + offs, q.to(Q.dtype.element_ty), mask=offs < K)
        tl.store(S + m, scale)


def quantize_rows_triton(x: torch.Tensor, fp8_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (row-contiguous, on CUDA) -> ([M, K] float8_e4m3fn, [M, 1] float32)."""
    m, k = x.shape
    q = torch.empty(m, k, device=x.device, dtype=torch.float8_e4m3fn)
    scales = torch.empty(m, 1, device=x.device, dtype=torch.float32)
    if m:
        block = triton.next_power_of_2(k)
        _quantize_rows_kernel[(m,)](x, q, scales, k, x.stride(0), q.stride(0),
                                    FP8_MAX=fp8_max, INV_FP8_MAX=1.0 / fp8_max, BLOCK=block,
                                    num_warps=8 if block >= 4096 else 4)
    return q, scales
