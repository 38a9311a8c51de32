"""``--prefill-dtype fp8`` on CUDA (the CPU twins: ``tests/unit/cloud/test_fp8_prefill.py``).

The fp8 GEMM (``torch._scaled_mm`` with per-row and per-channel scales) equals its
dequantised float32 reference to bf16 rounding at the 7B decoder's shapes and a
prompt's row counts; the toy target in bf16 prefills through it with CUDA graphs on,
stays close to the bf16 prefill, and its decode steps (graph replays on the bf16
weights) run after it.
"""

from __future__ import annotations

import pytest
import torch

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.build import (
    build_static_engine,
    kv_bytes_per_slot,
    static_kv_plan,
)
from eventspec.cloud.model_dirs import model_dir
from eventspec.cloud.target import load_target
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.fp8 import (
    fp8_mm,
    quantize_fp8,
    quantize_rows,
    quantize_rows_torch,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SHAPES = [(1, 12288, 4096), (2103, 12288, 4096), (2103, 4096, 11008), (700, 22016, 4096)]


def _fp8_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.skipif(not _fp8_capable(), reason="fp8 GEMMs need compute capability 8.9+")
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_the_fp8_gemm_equals_its_dequantised_reference(m: int, n: int, k: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    wq = quantize_fp8(w)
    xq, xs = quantize_rows(x)
    reference = (xq.float() * xs) @ (wq.q.float() * wq.scales[:, None]).t()  # [M, N]
    got = fp8_mm(x, wq)
    assert got.dtype == torch.bfloat16
    rel = float((got.float() - reference).norm() / reference.norm())
    assert rel < 1e-2, rel  # bf16 output rounding
    dense = (x.float() @ w.float().t())
    assert float((got.float() - dense).norm() / dense.norm()) < 0.1


@pytest.mark.skipif(not _fp8_capable(), reason="fp8 GEMMs need compute capability 8.9+")
def test_the_toy_target_prefills_in_fp8_with_graphs_and_decodes_after() -> None:
    target = load_target(model_dir("toy"), device="cuda", dtype=torch.bfloat16)
    kv = static_kv_plan(target, kv_cache_bytes=3 * kv_bytes_per_slot(target, 256),
                        max_seq_len=256)
    engine = build_static_engine(target, kv, session_buckets=(1, 2), token_buckets=(1,),
                                 prefill_dtype="fp8")
    assert engine.use_graphs and engine.prefill_weights is not engine.weights
    ids = target.build_prompt_ids("What is moving?")
    g = target.geometry
    pix = torch.randn((1, g.num_frames, 3, g.image_size, g.image_size),
                      generator=torch.Generator().manual_seed(0)).to("cuda", torch.bfloat16)
    a = engine.prefill([PrefillRequest(0, ids, pixel_values_videos=pix)])[0]
    fp8_weights = engine.prefill_weights
    engine.prefill_weights = engine.weights
    b = engine.prefill([PrefillRequest(1, ids, pixel_values_videos=pix)])[0]
    engine.prefill_weights = fp8_weights
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.95
    vocab = target.text_vocab_size
    tokens = [int(a[:vocab].argmax()), int(b[:vocab].argmax())]
    out = engine.step(StepBatch((0, 1), (len(ids), len(ids)), (1, 1),
                                torch.tensor(tokens, device="cuda")))  # a graph replay
    assert out.shape == (2, a.shape[0]) and bool(torch.isfinite(out).all())


@pytest.mark.parametrize(("m", "k"), [(1, 4096), (2103, 11008), (37, 192)])
def test_the_triton_row_quantisation_matches_the_torch_one(m: int, k: int) -> None:
    """Scales within one float32 rounding of torch's; codes equal but for rare ties,
    where Triton's conversion rounds a value to the neighbouring E4M3 code."""
    x = (torch.randn(m, k, device="cuda") * 3).bfloat16()
    x[0] = 0  # a zero row: scale clamped, values zero
    q, s = quantize_rows(x)  # the Triton kernel on CUDA
    q_ref, s_ref = quantize_rows_torch(x)
    torch.testing.assert_close(s, s_ref, rtol=2.0**-23, atol=0.0)
    a, b = q.float(), q_ref.float()
    differ = float((a != b).float().mean())
    assert differ < 1e-2, differ
    assert bool(((a - b).abs() <= b.abs() * 2.0**-3 + 2.0**-9).all())
    assert bool((a[0] == 0).all())
