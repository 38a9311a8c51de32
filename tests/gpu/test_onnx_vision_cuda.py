"""The ONNX vision path as ``--vision-backend onnx`` runs it on a GPU: the CUDA execution
provider with the export's fp16 graphs (attention, LayerNorm and QuickGELU fused).

The toy draft and adapter are exported (fp32 traced on the CPU, as the command does),
then run on CUDA in fp16 against torch fp32 on the same GPU. Tolerance: fp16 keeps 11
bits, and the graphs chain a few layers, so each output is within 1e-2 of its largest
magnitude (max |onnx - torch| / max |torch| per tensor). Skipped when this ONNX Runtime
has no CUDA execution provider (onnxruntime-gpu is not installed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eventspec.edge.drafting.cache import DraftCache
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.model_dirs import TOY_ADAPTER_DIR, TOY_DRAFT_DIR
from eventspec.edge.vision.align import load_adapter
from eventspec.edge.vision.onnx_backend import CUDA_EP, load_onnx_vision
from tests.support.gpu_compare import Record
from tests.support.onnx_vision import toy_onnx_export, toy_pixels

ort = pytest.importorskip("onnxruntime")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(CUDA_EP not in ort.get_available_providers(),
                       reason="this ONNX Runtime has no CUDA execution provider "
                              "(install onnxruntime-gpu)"),
]

#: fp16 on the CUDA EP vs torch fp32: max |onnx - torch| over a tensor / max |torch|.
FP16_TOLERANCE = 1e-2
QUESTION = "Which way is the object moving?"


@pytest.fixture(scope="module")
def export() -> Path:
    return toy_onnx_export()


def test_cuda_fp16_features_match_torch(export: Path, record_property: Record) -> None:
    device = torch.device("cuda")
    ref = load_draft(TOY_DRAFT_DIR, device="cuda", dtype=torch.float32)
    draft = load_draft(TOY_DRAFT_DIR, device="cuda", dtype=torch.float32)
    path = load_onnx_vision(export, model_dir=TOY_DRAFT_DIR, adapter_dir=TOY_ADAPTER_DIR,
                            device=device)
    assert (path.provider, path.precision) == (CUDA_EP, "fp16")
    draft.vision = path.vision
    assert path.aligner is not None
    adapter = load_adapter(TOY_ADAPTER_DIR).to(device)
    worst = {"clip": 0.0, "events": 0.0, "adapter": 0.0}
    same_drafts = 0
    for seed in range(4):
        pixels = toy_pixels(ref, seed)
        clip_t = ref.clip_features(pixels)  # [5, T, Dv] on CUDA
        clip_o = draft.clip_features(pixels)
        assert clip_o.device.type == "cuda" and clip_o.dtype == torch.float32
        with torch.no_grad():
            pairs = {"clip": (clip_o, clip_t),
                     "events": (draft.event_tokens(clip_t), ref.event_tokens(clip_t)),
                     "adapter": (path.aligner(clip_t), adapter(clip_t))}
        for name, (got, want) in pairs.items():
            rel = float((got.float() - want).abs().max() / want.abs().max())
            worst[name] = max(worst[name], rel)
        drafts = []
        for model in (ref, draft):
            drafter = DraftCache(model)
            drafter.prefill(QUESTION, pixels)
            seq: list[int] = []
            while len(seq) < 10 and (not seq or seq[-1] != model.eos_token_id):
                seq.append(drafter.draft_next(seq))
            drafts.append(seq)
        same_drafts += drafts[0] == drafts[1]
    record_property("onnx_fp16_vs_torch_fp32_rel", worst)
    record_property("onnx_fp16_identical_drafts_of_4", same_drafts)
    assert max(worst.values()) < FP16_TOLERANCE, worst
