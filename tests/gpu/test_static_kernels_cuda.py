"""The static engine's Triton kernels against torch, at the toy's and the 7B's head
shapes (and a grouped-query one), in float32, float16 and bfloat16.

RMSNorm and SiLU-mul are in ``test_static_engine_cuda.py``; the bf16 split-KV case at
7B shapes is in ``tests/unit/cloud/test_static_engine.py``.

Tolerances:
- RoPE + KV write: the kernel rotates in float32 and rounds once; the reference is the
  same rotation in float32 rounded to the dtype, so they differ by at most one unit in
  the last place of the dtype (``rtol`` = its epsilon), plus a float32-sized ``atol``
  where the two products cancel. V is a copy: bitwise. Nothing else in the cache moves.
- split-KV attention: float32 inputs go through ``tl.dot`` in TF32 (Triton's default),
  so float32 is held to 2e-3 relative (L2) error, half precision to 1e-2 (as the unit
  test); the numbers measured are recorded in the summary.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.gpu_compare import Record

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HEADS = [(6, 6, 32), (32, 32, 128), (32, 8, 128)]  # (Hq, Hkv, D): toy, 7B, grouped


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hkv", "d"), HEADS)
@pytest.mark.parametrize("m", [1, 37, 264])
def test_rope_and_kv_write_match_torch(dtype: torch.dtype, hq: int, hkv: int, d: int,
                                       m: int) -> None:
    from eventspec.shared.node.static.kernels import rope_and_write_kv
    from eventspec.shared.node.static.layers import rotate

    gen = torch.Generator(device="cuda").manual_seed(m * hkv)
    qkv = torch.randn(m, (hq + 2 * hkv) * d, device="cuda", generator=gen).to(dtype)
    angle = torch.rand(m, d // 2, device="cuda", generator=gen) * 100  # [M, D/2]
    cos = torch.cat([angle.cos(), angle.cos()], -1).to(dtype)  # [M, D], as HF's tables
    sin = torch.cat([angle.sin(), angle.sin()], -1).to(dtype)
    slots, t = 5, 300
    kc = torch.zeros(slots, hkv, t, d, device="cuda", dtype=dtype)  # [S, Hkv, T, D]
    vc = torch.zeros_like(kc)
    ws = torch.randint(0, slots, (m,), device="cuda", generator=gen)  # [M]
    wp = torch.randperm(t, device="cuda", generator=gen)[:m]  # [M], distinct rows
    q = rope_and_write_kv(qkv, cos, sin, kc, vc, ws, wp, hq, hkv)  # [M, Hq, D]

    def ref(x: torch.Tensor) -> torch.Tensor:
        return rotate(x.float(), cos.float(), sin.float()).to(dtype)

    rtol, atol = torch.finfo(dtype).eps, 1e-5
    torch.testing.assert_close(q, ref(qkv[:, : hq * d].view(m, hq, d)), rtol=rtol, atol=atol)
    k_want, v_want = torch.zeros_like(kc), torch.zeros_like(vc)
    k_want[ws, :, wp] = ref(qkv[:, hq * d : (hq + hkv) * d].view(m, hkv, d))
    v_want[ws, :, wp] = qkv[:, (hq + hkv) * d :].view(m, hkv, d)
    torch.testing.assert_close(kc, k_want, rtol=rtol, atol=atol)  # nothing else written
    assert torch.equal(vc, v_want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hkv", "d"), HEADS)
def test_splitkv_attention_matches_dense_attention(
    dtype: torch.dtype, hq: int, hkv: int, d: int, record_property: Record,
) -> None:
    """Ragged sessions (rolled-back ones: garbage beyond each length) at every split
    count the engine uses, against dense masked SDPA in float64."""
    from eventspec.shared.node.static.attention import reference_attention, splitkv_attention

    gen = torch.Generator(device="cuda").manual_seed(hq + hkv + d)
    worst = 0.0
    for bp, nq, splits in ((1, 1, 16), (2, 5, 8), (4, 9, 4), (3, 33, 2), (8, 17, 1)):
        q = torch.randn(bp, nq, hq, d, device="cuda", generator=gen).to(dtype)
        k = torch.randn(9, hkv, 700, d, device="cuda", generator=gen).to(dtype)
        v = torch.randn(9, hkv, 700, d, device="cuda", generator=gen).to(dtype)
        slots = torch.randperm(9, device="cuda", generator=gen)[:bp]
        starts = torch.randint(1, 600, (bp,), device="cuda", generator=gen)
        lens = starts + nq
        want = reference_attention(q.double(), k.double(), v.double(), slots, starts, lens)
        got = splitkv_attention(q, k, v, slots, starts, lens, num_splits=splits)
        err = float((got.double() - want).norm() / want.norm())
        worst = max(worst, err)
        assert err < (2e-3 if dtype == torch.float32 else 1e-2), (bp, nq, splits, err)
    record_property("max_rel_err", worst)
