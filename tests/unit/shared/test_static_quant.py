"""Weight-only int8 / int4 matmuls on the CPU equal the matmul with the dequantised weight.

PyTorch core's CPU kernels (``_weight_int8pack_mm``, ``_weight_int4pack_mm_for_cpu``)
are what the quantised drafter runs in CI; the reference is a plain float32 matmul with
the weight the codes and scales stand for. Quantisation error itself is bounded too
(int8: half a step per channel; int4: half a step per group).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.quant import (
    Int4Weight,
    QuantMode,
    int4_group_size,
    linear,
    linear_add_,
    quantize_int4,
    quantize_int8,
)


def _w(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 17), n8=st.integers(1, 12), kg=st.integers(1, 6),
       seed=st.integers(0, 2**16))
def test_int8_matmul_equals_the_dequantised_matmul(m: int, n8: int, kg: int, seed: int) -> None:
    n, k = 8 * n8, 32 * kg
    w = _w(n, k, seed)
    q = quantize_int8(w)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1))
    ref = x @ q.dequantize().t()  # [M, N]
    torch.testing.assert_close(linear(x, q), ref, rtol=1e-5, atol=1e-5)
    h = torch.randn(m, n)
    torch.testing.assert_close(linear_add_(h.clone(), x, q), h + ref, rtol=1e-5, atol=1e-5)
    step = w.abs().amax(dim=1, keepdim=True) / 127  # [N, 1]
    assert bool(((q.dequantize() - w).abs() <= step / 2 + 1e-7).all())


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 17), n8=st.integers(1, 12), kg=st.integers(1, 8),
       seed=st.integers(0, 2**16))
def test_int4_matmul_equals_the_dequantised_matmul(m: int, n8: int, kg: int, seed: int) -> None:
    n, k = 16 * n8, 32 * kg
    w = _w(n, k, seed)
    q = quantize_int4(w, keep_values=True)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 1))
    deq = q.dequantize()  # [N, K]
    torch.testing.assert_close(linear(x, q), x @ deq.t(), rtol=1e-4, atol=1e-4)
    g = q.group_size
    spread = w.view(n, k // g, g)
    step = (spread.amax(-1) - spread.amin(-1)) / 15  # [N, K/g]
    err = (deq - w).abs().view(n, k // g, g).amax(-1)
    assert bool((err <= step * 0.51 + 1e-6).all())


def test_int4_group_is_128_at_7b_widths_and_smaller_only_when_needed() -> None:
    assert int4_group_size(4096) == 128
    assert int4_group_size(11008) == 128
    assert int4_group_size(192) == 64
    assert int4_group_size(96) == 32
    with pytest.raises(InvalidInput, match="int4 needs an input width divisible"):
        int4_group_size(40)


def test_int4_refuses_shapes_it_cannot_pack() -> None:
    with pytest.raises(InvalidInput, match="N % 16"):
        quantize_int4(_w(24, 128, 0))
    q = quantize_int4(_w(16, 128, 0))
    assert isinstance(q, Int4Weight) and q.values is None
    with pytest.raises(InvalidInput, match="without its values"):
        q.dequantize()


def test_quant_bytes_shrink() -> None:
    w = _w(256, 1024, 0).bfloat16()
    dense = w.numel() * 2
    assert quantize_int8(w).nbytes < dense * 0.51
    assert quantize_int4(w).nbytes < dense * 0.29


def test_an_unknown_mode_names_the_choices() -> None:
    assert QuantMode.parse("int4") is QuantMode.INT4
    with pytest.raises(InvalidInput, match=r"int3.*none, int8, int4"):
        QuantMode.parse("int3")
