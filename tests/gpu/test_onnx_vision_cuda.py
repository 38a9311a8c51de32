"""The ONNX vision path as ``--vision-backend onnx`` runs it on a GPU: the CUDA execution
provider with the export's fp16 graphs (attention, LayerNorm and QuickGELU fused).

The toy draft and adapter are exported (fp32 traced on the CPU, as the command does),
then run on CUDA in fp16 against torch fp32 on the same GPU. Tolerance: fp16 keeps 11
bits, and the graphs chain a few layers, so each output is within 1e-2 of its largest
magnitude (max |onnx - torch| / max |torch| per tensor). Skipped when this ONNX Runtime
has no CUDA execution provider (onnxruntime-gpu is not installed).

CUDA graphs (``enable_cuda_graph``, on by default): each graph's session with graphs
must capture, and replay the input of each call, not the warm-up's: it is compared with
a session without graphs on the same input (the same kernels, so within 1e-3 of the
largest magnitude) and with torch fp32. TensorRT is tried where this ONNX Runtime lists
it; the test records whether it opened or fell back to the CUDA EP.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from eventspec.edge.drafting.cache import DraftCache
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.model_dirs import TOY_ADAPTER_DIR, TOY_DRAFT_DIR
from eventspec.edge.vision.align import load_adapter
from eventspec.edge.vision.onnx_backend import CUDA_EP, TRT_EP, load_onnx_vision
from eventspec.edge.vision.onnx_manifest import read_manifest
from eventspec.edge.vision.onnx_session import OrtGraph
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
#: The same fp16 graph with and without CUDA graphs: the same kernels replayed.
GRAPH_TOLERANCE = 1e-3
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
    record_property("cuda_graphs", path.cuda_graphs)
    assert path.cuda_graph, path.cuda_graphs
    assert path.vision.name == "onnx (CUDAExecutionProvider, fp16, CUDA graphs)"
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


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def torch_stages(draft: DraftModel, pixels: torch.Tensor) -> dict[str, tuple[torch.Tensor,
                                                                           torch.Tensor]]:
    """Each graph's input and torch fp32's output for it, on CUDA."""
    adapter = load_adapter(TOY_ADAPTER_DIR).to("cuda")
    with torch.no_grad():
        clip = draft.clip_features(pixels)
        return {"clip": (pixels, clip), "events": (clip, draft.event_tokens(clip)),
                "adapter": (clip, adapter(clip))}


def test_cuda_graph_sessions_replay_each_call_s_input(export: Path,
                                                      record_property: Record) -> None:
    device = torch.device("cuda")
    draft = load_draft(TOY_DRAFT_DIR, device="cuda", dtype=torch.float32)
    files = read_manifest(export)["graphs"]
    scenes = [torch_stages(draft, toy_pixels(draft, seed).cuda()) for seed in (0, 1)]
    worst: dict[str, dict[str, float]] = {}
    for name, pair in files.items():
        graphed = OrtGraph(export / pair["fp16"], CUDA_EP, device, cuda_graph=True)
        plain = OrtGraph(export / pair["fp16"], CUDA_EP, device, cuda_graph=False)
        assert graphed.cuda_graph, graphed.graph_fallback
        assert not plain.cuda_graph
        first = graphed(scenes[0][name][0])
        held = first.clone()
        second = graphed(scenes[1][name][0])
        assert torch.equal(first, held), f"{name}: the second call changed the first result"
        assert not torch.equal(first, second), f"{name}: the replay ignored the new input"
        worst[name] = {"graph_vs_plain": 0.0, "graph_vs_torch": 0.0}
        for scene, got in zip(scenes, (first, second), strict=True):
            x, want = scene[name]
            worst[name]["graph_vs_plain"] = max(worst[name]["graph_vs_plain"],
                                                rel(got, plain(x)))
            worst[name]["graph_vs_torch"] = max(worst[name]["graph_vs_torch"], rel(got, want))
    record_property("onnx_cuda_graph_rel", worst)
    assert max(w["graph_vs_plain"] for w in worst.values()) < GRAPH_TOLERANCE, worst
    assert max(w["graph_vs_torch"] for w in worst.values()) < FP16_TOLERANCE, worst


def test_the_input_torch_is_still_writing_is_waited_for(export: Path) -> None:
    """The caller's last kernels write the input on torch's stream just before the call;
    ORT runs on its own, so the graph must wait for them (and, on a side stream, too)."""
    device = torch.device("cuda")
    pair = read_manifest(export)["graphs"]["events"]
    graph = OrtGraph(export / pair["fp16"], CUDA_EP, device)
    plain = OrtGraph(export / pair["fp16"], CUDA_EP, device, cuda_graph=False)
    x = torch.randn(graph.input_shape, device=device, generator=torch.Generator(
        device=device).manual_seed(0))
    want = plain(x)
    big = torch.randn(4096, 4096, device=device)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            slow = big
            for _ in range(8):
                slow = slow @ big / 64  # keeps the stream busy for a few ms
            late = x + 0 * slow.mean().clamp(-1, 1)  # x, written after the matmuls
            got = graph(late)
        torch.cuda.synchronize()
        assert rel(got, want) < GRAPH_TOLERANCE


def test_tensorrt_opens_or_hands_over_to_cuda(export: Path, record_property: Record,
                                              caplog: pytest.LogCaptureFixture) -> None:
    if TRT_EP not in ort.get_available_providers():
        pytest.skip("this ONNX Runtime lists no TensorRT execution provider")
    with caplog.at_level(logging.WARNING, logger="eventspec.edge.vision.onnx_backend"):
        path = load_onnx_vision(export, model_dir=TOY_DRAFT_DIR, adapter_dir=None,
                                device=torch.device("cuda"), prefer="tensorrt")
    record_property("tensorrt_provider", path.provider)
    record_property("tensorrt_warnings", caplog.text[-2000:])
    assert path.provider in (TRT_EP, CUDA_EP)
    if path.provider == CUDA_EP:
        assert TRT_EP in caplog.text, caplog.text  # the fallback says why
