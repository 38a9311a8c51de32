"""The batch-invariant GEMM as a persistent kernel fed by TMA (Hopper and newer).

Why: the pointer-fed tiles of :func:`.invariant_kernels.invariant_mm` ran 1.4-1.7x
cuBLAS at a verify step's 144 rows and a prompt's 2,100 (``invariant-cross-tiles-
h200.json``), which bounds ``--batch-invariant``'s cost (issue 39 item 3). Here the same
arithmetic runs as Triton's persistent TMA matmul (``python/tutorials/09-persistent-
matmul.py``): one program per multiprocessor walks output tiles in the grouped order,
operands arrive by TMA into shared memory, and each tile's K is walked in order into one
fp32 accumulator by wgmma, with no split-K. So a row's bits are what the pointer-fed
kernel's argument gives them (:mod:`.invariant_kernels`' docstring): the K order and
the MMA instruction, neither of which depends on M, the tile's place or the grid. TMA
only changes how the bytes reach shared memory; ``make test-gpu`` and ``python -m
benchmarks.probe_invariant_persistent`` check the bits against the pointer-fed kernel.

Rows past M load as zeros (TMA fills out-of-bounds boxes) and are never stored (TMA
clips stores at the tensor's bounds), as the masks do there.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from eventspec.shared.node.static.attention import HAVE_TRITON
from eventspec.shared.node.static.invariant_tiles import MmConfig, cdiv

__all__ = ["cuda_index", "persistent_invariant_mm", "sm_count", "tma_available"]

if HAVE_TRITON:
    import triton.language as tl
    from triton import jit

    @jit(do_not_specialize=["M"])  # type: ignore[untyped-decorator]
    def _persistent_mm_kernel(  # type: ignore[no-untyped-def]
        x_desc, w_desc, o_desc, M, N, K,
        PROGRAMS: tl.constexpr, ACCUMULATE: tl.constexpr, OUT_BF16: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
    ):  # fmt: skip
        """Output tiles ``pid, pid + PROGRAMS, ...`` in grouped order, each over all of
        K in order (x [M, K], w [N, K], out [M, N] through their descriptors)."""
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        k_tiles = tl.cdiv(K, BLOCK_K)
        per_group = GROUP_M * num_n
        for tile in tl.range(tl.program_id(0), num_m * num_n, PROGRAMS):
            first_m = (tile // per_group) * GROUP_M
            size_m = tl.minimum(num_m - first_m, GROUP_M)
            off_m = (first_m + (tile % per_group) % size_m) * BLOCK_M
            off_n = ((tile % per_group) // size_m) * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a = x_desc.load([off_m, ki * BLOCK_K])  # [BM, BK]
                b = w_desc.load([off_n, ki * BLOCK_K])  # [BN, BK]
                acc = tl.dot(a, b.T, acc)
            if ACCUMULATE:
                acc += o_desc.load([off_m, off_n]).to(tl.float32)
            if OUT_BF16:
                o_desc.store([off_m, off_n], acc.to(tl.bfloat16))
            else:
                o_desc.store([off_m, off_n], acc.to(tl.float16))


def tma_available(device: torch.device) -> bool:
    """Whether this process can run the persistent TMA kernel on ``device``: Triton
    with host tensor descriptors, and compute capability 9.0 or newer."""
    if not HAVE_TRITON or device.type != "cuda":
        return False
    return _tma_on(cuda_index(device))


def cuda_index(device: torch.device) -> int:
    """``device``'s CUDA index; plain ``cuda`` names the current device."""
    return torch.cuda.current_device() if device.index is None else device.index


@functools.cache
def _tma_on(index: int) -> bool:
    """:func:`tma_available` for CUDA device ``index``, asked once a device: the answer
    cannot change in a process, and the GEMM asks on every call (about 160 a prefill)."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(index) >= (9, 0)


@functools.cache
def sm_count(index: int) -> int:
    """Multiprocessors of CUDA device ``index``, asked once a device (the persistent
    kernel's program count, on every call)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def persistent_invariant_mm(x: torch.Tensor, w: torch.Tensor, dest: torch.Tensor,
                            config: MmConfig, *, accumulate: bool) -> torch.Tensor:
    """``dest = x @ w.T`` (``+=`` with ``accumulate``) for row-major x [M, K], w [N, K]
    and dest [M, N] in bf16 or fp16, on ``config``'s tile (checked by the caller,
    :func:`.invariant_kernels.invariant_mm`)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = x.shape
    n = w.shape[0]
    c = config
    x_desc = TensorDescriptor(x, [m, k], [k, 1], [c.block_m, c.block_k])
    w_desc = TensorDescriptor(w, [n, k], [w.stride(0), 1], [c.block_n, c.block_k])
    o_desc = TensorDescriptor(dest, [m, n], [n, 1], [c.block_m, c.block_n])
    programs = sm_count(cuda_index(x.device))
    tiles = cdiv(m, c.block_m) * cdiv(n, c.block_n)
    kernel: Any = _persistent_mm_kernel
    kernel[(min(programs, tiles),)](
        x_desc, w_desc, o_desc, m, n, k, PROGRAMS=programs, ACCUMULATE=accumulate,
        OUT_BF16=x.dtype == torch.bfloat16, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
        BLOCK_K=c.block_k, GROUP_M=c.group_m, num_warps=c.num_warps, num_stages=c.num_stages,
    )  # fmt: skip
    return dest
