"""The quantised drafter's CUDA kernels: the Triton int8 and int4 matmuls.

Each is checked against the dense matmul with the dequantised weight (bf16 inputs,
float32 reference): within 2e-2 relative (L2 over the output), the rounding of bf16
outputs and of bf16-widened tiles. Then the toy draft in bf16 drafts with int8 and int4
weights through the CUDA graphs, and every graph replay equals the same backend without
graphs (the kernels are deterministic: no split-K, no atomics).
"""

from __future__ import annotations

import pytest
import torch

from eventspec.edge.drafting.cache import DraftCache
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.drafting.static_backend import StaticDraftBackend
from eventspec.edge.model_dirs import TOY_DRAFT_DIR
from eventspec.shared.node.static.quant import (
    QuantMode,
    linear,
    linear_add_,
    quantize_int4,
    quantize_int8,
)
from tests.support.gpu_compare import Record

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SHAPES = [(1, 12288, 4096), (16, 4096, 11008), (3, 576, 192), (700, 4096, 4096)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12))


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantised_matmul_equals_the_dequantised_one(
    m: int, n: int, k: int, mode: str, record_property: Record
) -> None:
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    q = quantize_int8(w) if mode == "int8" else quantize_int4(w, keep_values=True)
    ref = x.float() @ q.dequantize().t()  # [M, N] float32
    out = linear(x, q)
    err = _rel(out, ref)
    h = torch.randn(m, n, device="cuda", generator=g).bfloat16()
    err_add = _rel(linear_add_(h.clone(), x, q), h.float() + ref)
    record_property("rel_err", err)
    record_property("rel_err_add", err_add)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert err < 2e-2 and err_add < 2e-2


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_graph_drafts_equal_eager_drafts_with_quantised_weights(
    mode: str, record_property: Record
) -> None:
    drafts = []
    for graphs in (False, True):
        draft = load_draft(TOY_DRAFT_DIR, device="cuda", dtype=torch.bfloat16)
        pixels = torch.randn(5, 3, draft.image_size, draft.image_size,
                             generator=torch.Generator().manual_seed(0))
        backend = StaticDraftBackend(draft, quant=QuantMode.parse(mode), use_graphs=graphs)
        backend.warm_up()
        drafter = DraftCache(backend)
        drafter.prefill("Which way is the object moving?", pixels)
        seq: list[int] = []
        for _ in range(12):
            seq.append(drafter.draft_next(seq))
        seq = [*seq[:5], 7, 9]  # a diverging commit: rollback, then a 3-token refeed
        for _ in range(6):
            seq.append(drafter.draft_next(seq))
        drafts.append(seq)
    record_property("drafts", drafts[1])
    assert drafts[0] == drafts[1]
