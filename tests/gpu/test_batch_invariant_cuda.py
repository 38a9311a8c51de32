"""``--batch-invariant`` on CUDA (``make test-gpu``): the same bitwise checks as
``tests/unit/cloud/test_batch_invariant.py``, where cuBLAS and the CUDA reductions pick
their kernels by shape (not run yet: no device time when it was written)."""

from __future__ import annotations

import pytest
import torch

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.build import (
    build_static_engine,
    kv_bytes_per_slot,
    static_kv_plan,
)
from eventspec.cloud.model_dirs import TOY, model_dir
from eventspec.cloud.target import load_target
from eventspec.shared.node.static.batch import StepBatch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SLOTS = 17


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_session_gets_the_same_bits_in_any_batch_on_cuda(dtype: torch.dtype) -> None:
    target = load_target(model_dir(TOY), device="cuda", dtype=dtype)
    kv = static_kv_plan(target, kv_cache_bytes=(SLOTS + 1) * kv_bytes_per_slot(target, 512),
                        max_seq_len=512)
    engine = build_static_engine(target, kv, batch_invariant=True)
    g = target.geometry
    ids = target.build_prompt_ids("What is moving?")
    for slot in range(SLOTS):
        pix = torch.randn((1, g.num_frames, 3, g.image_size, g.image_size),
                          generator=torch.Generator().manual_seed(slot)).to("cuda", dtype)
        engine.prefill([PrefillRequest(slot, ids, pixel_values_videos=pix)])
    n = len(ids)

    def step(slots: list[int], start: int, tokens: list[int]) -> torch.Tensor:
        batch = StepBatch(tuple(slots), (start,) * len(slots), (len(tokens),) * len(slots),
                          torch.tensor(tokens * len(slots), device="cuda"))
        return engine.step(batch)

    for tokens in ([7], [7, 11, 5, 7, 3, 9, 2, 8, 4]):
        alone = step([3], n, tokens)
        for batch in ([0, 1, 2, 3], list(range(16))):
            at = batch.index(3) * len(tokens)
            assert torch.equal(alone, step(batch, n, tokens)[at : at + len(tokens)])
    verify = step([5], n, [7, 11, 5, 7])
    singles = torch.cat([step([5], n + i, [t]) for i, t in enumerate([7, 11, 5, 7])])
    assert torch.equal(verify, singles)
