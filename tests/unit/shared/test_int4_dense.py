"""Reading core's CUDA int4 packing on the CPU: the layout arithmetic the Triton widening
kernel uses, checked against a line-by-line transcription of core's packer
(``matrix_to_m16n8k16_Bint4_layout`` in ``aten/src/ATen/native/cuda/int4mm.cu``).

The GPU twin (``tests/gpu/test_int4_dense_cuda.py``) checks the same functions against
core's packer itself and the Triton kernel against :func:`dequantize_reference`.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.shared.node.static.int4_dense import (
    INT4_DENSE_MIN_ROWS,
    dequantize_int4,
    pack_reference,
    packed_position,
    prefers_dense,
    unpack_reference,
)
from eventspec.shared.node.static.quant import Int4Weight, linear, quantize_int4


def _core_packer(pairs: torch.Tensor, inner_k_tiles: int) -> torch.Tensor:
    """Core's CUDA packer transcribed as loops: ``pairs`` [N, K/2] uint8 -> int32 words
    [N/8, K/(16 T), 32, T/2]. Slow and literal on purpose: the independent reference."""
    n, half_k = int(pairs.shape[0]), int(pairs.shape[1])
    k_super = 2 * half_k // (16 * inner_k_tiles)
    out = torch.zeros(n // 8, k_super, 32, inner_k_tiles // 2, dtype=torch.int64)
    p = pairs.tolist()
    for n_tile in range(n // 8):
        for k_outer in range(k_super):
            for t in range(32):
                for inner in range(0, inner_k_tiles, 2):
                    n0 = n_tile * 8 + t // 4
                    k_base0 = (k_outer * inner_k_tiles + inner) * 16 // 2
                    ks = [k_base0 + t % 4, k_base0 + t % 4 + 4]
                    k_base1 = k_base0 + 16 // 2
                    ks += [k_base1 + t % 4, k_base1 + t % 4 + 4]
                    v = [p[n0][j] for j in ks]
                    pack = (
                        ((v[3] & 0xF) << 28) | ((v[2] & 0xF) << 24) | ((v[1] & 0xF) << 20)
                        | ((v[0] & 0xF) << 16) | ((v[3] & 0xF0) << 8) | ((v[2] & 0xF0) << 4)
                        | (v[1] & 0xF0) | ((v[0] & 0xF0) >> 4)
                    )  # fmt: skip
                    out[n_tile, k_outer, t, inner // 2] = pack
    return ((out + 2**31) % 2**32 - 2**31).to(torch.int32)


def _values(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)  # [N, K]


def _pairs(values: torch.Tensor) -> torch.Tensor:
    return (values[:, ::2] << 4) | values[:, 1::2]  # [N, K/2], as quant.quantize_int4 packs


@settings(max_examples=12, deadline=None)
@given(
    n_tiles=st.integers(1, 3), tiles=st.sampled_from([2, 4, 8]), k_outer=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_the_torch_packing_is_cores_packing(
    n_tiles: int, tiles: int, k_outer: int, seed: int
) -> None:
    values = _values(8 * n_tiles, 16 * tiles * k_outer, seed)
    assert torch.equal(pack_reference(values, tiles), _core_packer(_pairs(values), tiles))


@settings(max_examples=25, deadline=None)
@given(
    n_tiles=st.integers(1, 6), tiles=st.sampled_from([2, 4, 8]), k_outer=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_unpacking_inverts_packing(n_tiles: int, tiles: int, k_outer: int, seed: int) -> None:
    n, k = 8 * n_tiles, 16 * tiles * k_outer
    values = _values(n, k, seed)
    assert torch.equal(unpack_reference(pack_reference(values, tiles), n, k), values)


def test_every_nibble_of_the_packing_holds_exactly_one_weight() -> None:
    n, k, tiles = 24, 256, 4
    rows = torch.arange(n)[:, None]
    cols = torch.arange(k)[None, :]
    word, shift = packed_position(rows, cols, k, tiles)
    nibble = (word * 8 + shift // 4).reshape(-1)
    assert int(nibble.unique().numel()) == n * k
    assert int(nibble.min()) == 0 and int(nibble.max()) == n * k - 1


def _weight(n: int, k: int, group: int, tiles: int, seed: int) -> Int4Weight:
    values = _values(n, k, seed)
    g = torch.Generator().manual_seed(seed + 1)
    sz = torch.randn(k // group, n, 2, generator=g).bfloat16()  # [K/g, N, 2]
    return Int4Weight(pack_reference(values, tiles), sz, group, n, k, values)


def test_widening_on_the_cpu_equals_the_kept_values_dequantised() -> None:
    w = _weight(32, 256, 64, 8, seed=3)
    dense = dequantize_int4(w)  # [N, K] bf16, the torch twin of the Triton pass
    assert dense.shape == (32, 256) and dense.dtype == torch.bfloat16
    assert torch.equal(dense, w.dequantize().bfloat16())


def test_only_cuda_steps_with_many_rows_widen_the_weight() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert not prefers_dense(INT4_DENSE_MIN_ROWS - 1, cuda)
    assert prefers_dense(INT4_DENSE_MIN_ROWS, cuda)
    assert prefers_dense(4096, cuda)
    assert not prefers_dense(4096, cpu)


def test_a_long_cpu_prefill_keeps_cores_kernel() -> None:
    """The CPU's packing is not the CUDA layout: many rows must not take the widening."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * 0.02
    q = quantize_int4(w, keep_values=True)
    x = torch.randn(INT4_DENSE_MIN_ROWS + 5, 256, generator=g)  # [M, K]
    ref = x @ q.dequantize().t()
    assert torch.allclose(linear(x, q), ref, rtol=1e-3, atol=1e-3)
