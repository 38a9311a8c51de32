"""An int4 weight widened back to a dense matrix, for the steps with many rows.

Core's CUDA int4 matmul (gpt-fast's tinygemm, ``_weight_int4pack_mm``) is built for the
few rows of a draft step: it re-reads and re-widens the packed weight for every 16-row
tile of the activations, so a long prefill through it is arithmetic-starved (737 prompt
tokens through the 7B drafter: 338 ms on an H200 against 36 ms in bf16,
``benchmarks/results/edge_h200.json``). For many rows the cheap order is the other one:
widen the weight once, in one pass over its bytes, then run the dense bf16 GEMM (the
"dequantise-then-GEMM" of HQQ's and torchao's prefill paths). The widening reads 0.5
byte and writes 2 bytes per weight (about 0.17 ms per 7B layer at H200 bandwidth), so
it pays once a step has more rows than :data:`INT4_DENSE_MIN_ROWS`.

The weight stays stored once, in core's packed layout; this module reads that layout
directly. Core's packer (``_convert_weight_to_int4pack`` on CUDA,
``matrix_to_m16n8k16_Bint4_layout`` in ``aten/src/ATen/native/cuda/int4mm.cu``) writes
the ``[N, K/2]`` byte pairs (high nibble = even k) into int32 words shaped
``[N/8, K/(16 T), 32, T/2]`` (``T`` = inner k-tiles): word ``(n/8, ko, lane, p)`` holds,
for lane ``t``, row ``n = 8 (n/8) + t // 4`` and the bytes ``j = 8 (T ko + 2p) + t % 4 +
{0, 4, 8, 12}``, high nibbles in bits 0-15 and low nibbles in bits 16-31.
:func:`packed_position` inverts that; the Triton kernel does the same arithmetic per
element, and :func:`unpack_reference` (torch, any device) is its CPU twin, checked
against :func:`pack_reference` on the CPU and against core's packer on the GPU.

The CPU keeps core's ``_weight_int4pack_mm_for_cpu`` at every row count: its packing is
another layout, and it has no few-rows specialisation to escape.
"""

from __future__ import annotations

from typing import Any, Final

import torch

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.attention import HAVE_TRITON
from eventspec.shared.node.static.weight_formats import Int4Weight

#: From this many rows a CUDA int4 matmul widens the weight and runs the dense GEMM;
#: below, core's tinygemm. ``python -m benchmarks.probe_int4_dense`` measures both per
#: row count on the 7B drafter's four shapes (``benchmarks/results/int4-dense-*.json``).
INT4_DENSE_MIN_ROWS: Final[int] = 64


def packed_position(
    n: Any, k: Any, in_features: int, inner_k_tiles: int
) -> tuple[Any, Any]:
    """Where weight element ``(n, k)`` lives in core's CUDA int4 packing: the flat index
    of its int32 word and the bit shift of its nibble. ``n`` and ``k`` are integer
    tensors (broadcastable); the arithmetic is the Triton kernel's, line for line."""
    k_outer_tiles = in_features // (16 * inner_k_tiles)
    byte = k // 2  # [.., K/2] byte of the [N, K/2] pairs
    low = k % 2  # odd k: the byte's low nibble
    rem = byte % (8 * inner_k_tiles)
    k_tile = rem // 8  # which 16-wide k-tile inside the outer tile
    within = rem % 8
    lane = (n % 8) * 4 + within % 4
    slot = 2 * (k_tile % 2) + within // 4  # v[0..3] of the packer
    word = (((n // 8) * k_outer_tiles + byte // (8 * inner_k_tiles)) * 32 + lane) * (
        inner_k_tiles // 2
    ) + k_tile // 2
    shift = 4 * (slot + 4 * low)
    return word, shift


def _grid(n: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    rows = torch.arange(n, device=device, dtype=torch.int64)[:, None]  # [N, 1]
    cols = torch.arange(k, device=device, dtype=torch.int64)[None, :]  # [1, K]
    return rows, cols


def inner_k_tiles_of(w: Int4Weight) -> int:
    """``T`` of a CUDA-packed weight: its last dimension holds ``T / 2`` words."""
    if w.packed.dim() != 4:
        raise InvalidInput(f"not a CUDA int4 packing: packed has shape {tuple(w.packed.shape)}")
    return 2 * int(w.packed.shape[3])


def unpack_reference(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """The 4-bit values [N, K] uint8 of a CUDA int4 packing ``packed``
    [N/8, K/(16 T), 32, T/2] int32, by gathers in torch (any device)."""
    tiles = 2 * int(packed.shape[3])
    rows, cols = _grid(out_features, in_features, packed.device)
    word, shift = packed_position(rows, cols, in_features, tiles)  # [N, K] each
    words = packed.reshape(-1).to(torch.int64) & 0xFFFFFFFF  # [W] as unsigned
    values: torch.Tensor = ((words[word] >> shift) & 15).to(torch.uint8)  # [N, K]
    return values


def pack_reference(values: torch.Tensor, inner_k_tiles: int) -> torch.Tensor:
    """Core's CUDA packing of ``values`` [N, K] (0..15), written in torch so the CPU can
    check :func:`unpack_reference` (and the GPU can check both against core)."""
    n, k = int(values.shape[0]), int(values.shape[1])
    if n % 8 or k % (16 * inner_k_tiles):
        raise InvalidInput(
            f"pack needs N % 8 == 0 and K % {16 * inner_k_tiles} == 0, got [{n}, {k}]"
        )
    rows, cols = _grid(n, k, values.device)
    word, shift = packed_position(rows, cols, k, inner_k_tiles)
    total = (n // 8) * (k // (16 * inner_k_tiles)) * 32 * (inner_k_tiles // 2)
    bits = values.to(torch.int64) << shift  # [N, K], disjoint bits per word
    words = torch.zeros(total, dtype=torch.int64, device=values.device)
    words.index_add_(0, word.reshape(-1), bits.reshape(-1))
    signed = (words + 2**31) % 2**32 - 2**31  # the int32 the packer stores
    shape = (n // 8, k // (16 * inner_k_tiles), 32, inner_k_tiles // 2)
    return signed.to(torch.int32).view(shape)


def dequantize_reference(w: Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    """[N, K] in ``dtype``: ``(q - 8) * s + z`` in float32 over the unpacked values."""
    n, k, g = w.out_features, w.in_features, w.group_size
    q = unpack_reference(w.packed, n, k).float().view(n, k // g, g)  # [N, K/g, g]
    sz = w.scales_and_zeros.float().transpose(0, 1)  # [N, K/g, 2]
    return ((q - 8) * sz[..., :1] + sz[..., 1:]).view(n, k).to(dtype)


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def _int4_widen_kernel(  # type: ignore[no-untyped-def]
        P, SZ, Out, N, K, K_OUTER,
        T: tl.constexpr, G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        """One BLOCK_N x BLOCK_K tile of the dense weight: each element finds its word
        and nibble as :func:`packed_position` does, then ``(q - 8) * s + z``."""
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]  # [BN, 1]
        k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)[None, :]  # [1, BK]
        ok = (n < N) & (k < K)
        byte = k // 2
        rem = byte % (8 * T)
        k_tile = rem // 8
        within = rem % 8
        lane = (n % 8) * 4 + within % 4
        slot = 2 * (k_tile % 2) + within // 4
        word = (((n // 8) * K_OUTER + byte // (8 * T)) * 32 + lane) * (T // 2) + k_tile // 2
        shift = 4 * (slot + 4 * (k % 2))
        q = (tl.load(P + word, mask=ok, other=0) >> shift) & 15  # [BN, BK]
        sz = ((k // G) * N + n) * 2
        s = tl.load(SZ + sz, mask=ok, other=0.0).to(tl.float32)
        z = tl.load(SZ + sz + 1, mask=ok, other=0.0).to(tl.float32)
        w = (q.to(tl.float32) - 8.0) * s + z
        tl.store(Out + n * K + k, w.to(Out.dtype.element_ty), mask=ok)


def dequantize_int4(w: Int4Weight) -> torch.Tensor:
    """[N, K] dense weight, in the scales' dtype, of a CUDA-packed ``w``: one Triton pass
    on a GPU, :func:`dequantize_reference` elsewhere."""
    dtype = w.scales_and_zeros.dtype
    if w.packed.device.type != "cuda" or not HAVE_TRITON:
        return dequantize_reference(w, dtype)
    n, k = w.out_features, w.in_features
    tiles = inner_k_tiles_of(w)
    out = torch.empty(n, k, device=w.packed.device, dtype=dtype)  # [N, K]
    block_n, block_k = 32, 128
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    _int4_widen_kernel[grid](
        w.packed, w.scales_and_zeros, out, n, k, k // (16 * tiles),
        T=tiles, G=w.group_size, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    return out


def prefers_dense(rows: int, device: torch.device) -> bool:
    """Whether an int4 matmul of ``rows`` activation rows on ``device`` widens the
    weight first (CUDA, at least :data:`INT4_DENSE_MIN_ROWS` rows)."""
    return device.type == "cuda" and rows >= INT4_DENSE_MIN_ROWS
