"""The int4 widening on the GPU: core's own packer read back exactly, the Triton pass
equal to its torch twin, and long prefills through it close to the dense reference.

The CPU half (``tests/unit/shared/test_int4_dense.py``) checks the same layout
arithmetic against a transcription of core's packer; here it meets the real one.
"""

from __future__ import annotations

import pytest
import torch

from eventspec.shared.node.static.int4_dense import (
    INT4_DENSE_MIN_ROWS,
    dequantize_int4,
    dequantize_reference,
    inner_k_tiles_of,
    pack_reference,
    unpack_reference,
)
from eventspec.shared.node.static.quant import linear, linear_add_, quantize_int4
from tests.support.gpu_compare import Record

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SHAPES = [(12288, 4096), (4096, 11008), (576, 192), (64, 256)]


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_cores_packing_reads_back_exactly(n: int, k: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    q = quantize_int4(w, keep_values=True)
    assert q.values is not None
    assert torch.equal(unpack_reference(q.packed, n, k), q.values)
    assert torch.equal(pack_reference(q.values, inner_k_tiles_of(q)), q.packed)


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_the_triton_widening_equals_its_torch_twin(n: int, k: int, record_property: Record) -> None:
    g = torch.Generator(device="cuda").manual_seed(n * 3 + k)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    q = quantize_int4(w, keep_values=True)
    widened = dequantize_int4(q)  # [N, K] bf16, Triton
    twin = dequantize_reference(q, torch.bfloat16)
    mismatched = int((widened != twin).sum())
    record_property("mismatched", mismatched)
    # FMA contraction may round (q - 8) * s + z once instead of twice: one bf16 step at most.
    assert torch.allclose(widened.float(), twin.float(), rtol=1e-2, atol=0)
    assert mismatched <= n * k // 1000


@pytest.mark.parametrize("m", [INT4_DENSE_MIN_ROWS - 1, INT4_DENSE_MIN_ROWS, 737])
def test_both_int4_orders_agree_with_the_dense_reference(m: int, record_property: Record) -> None:
    n, k = 4096, 4096
    g = torch.Generator(device="cuda").manual_seed(m)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    q = quantize_int4(w, keep_values=True)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()  # [M, K]
    ref = x.float() @ q.dequantize().t()  # [M, N] float32
    out = linear(x, q)
    h = torch.randn(m, n, device="cuda", generator=g).bfloat16()
    out_add = linear_add_(h.clone(), x, q)
    err = float((out.float() - ref).norm() / ref.norm())
    err_add = float((out_add.float() - (h.float() + ref)).norm() / (h.float() + ref).norm())
    record_property("rel_err", err)
    assert err < 2e-2 and err_add < 2e-2
