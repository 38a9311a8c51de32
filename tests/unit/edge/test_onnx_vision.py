"""The vision path on ONNX Runtime (CPU execution provider) against PyTorch fp32.

One export of the shipped toy draft and adapter, made by ``eventspec-edge export-onnx``
(tests/support/onnx_vision.py), serves every test here. Tolerance: fp32 on the CPU,
the graphs differ from torch by reordered float sums only, so each output is within
2e-5 of its largest magnitude (measured on toy scenes 0-2: CLIP 1.5e-5 of 11, event
tokens 1.1e-5 of 65, adapter 5.5e-5 of 18, i.e. at most 3.1e-6 relative). Drafts, the
argmaxes of logits computed from those features, must be identical.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eventspec.edge.config import VISION_ORT_PROVIDERS
from eventspec.edge.drafting.cache import DraftCache
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.drafting.static_backend import StaticDraftBackend
from eventspec.edge.model_dirs import TOY_ADAPTER_DIR, TOY_DRAFT_DIR
from eventspec.edge.vision.align import load_adapter
from eventspec.edge.vision.backend import TorchVision
from eventspec.edge.vision.onnx_backend import (
    CPU_EP,
    CUDA_EP,
    PROVIDER_CHOICES,
    TRT_EP,
    OrtGraph,
    choose_provider,
    describe,
    first_that_opens,
    load_onnx_vision,
    provider_chain,
)
from eventspec.edge.vision.onnx_manifest import read_manifest
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput, NotFound
from tests.support.onnx_vision import toy_onnx_export, toy_pixels

#: fp32 on the CPU: max |ONNX Runtime - torch| over a tensor, relative to max |torch|.
FP32_TOLERANCE = 2e-5
SCENES = (0, 1, 2)
QUESTION = "Which way is the object moving?"


@pytest.fixture(scope="module")
def export() -> Path:
    return toy_onnx_export()


@pytest.fixture(scope="module")
def toy() -> DraftModel:
    return load_draft(TOY_DRAFT_DIR)


def onnx_draft(export: Path, adapter: bool = True) -> tuple[DraftModel, object]:
    """A toy draft whose vision runs on ORT, and the ORT adapter."""
    draft = load_draft(TOY_DRAFT_DIR)
    path = load_onnx_vision(export, model_dir=TOY_DRAFT_DIR,
                            adapter_dir=TOY_ADAPTER_DIR if adapter else None,
                            device=torch.device("cpu"))
    assert (path.provider, path.precision) == (CPU_EP, "fp32")
    assert path.cuda_graph is False and set(path.cuda_graphs) == (
        {"clip", "events", "adapter"} if adapter else {"clip", "events"})
    draft.vision = path.vision
    return draft, path.aligner


def test_features_match_torch_within_tolerance(export: Path, toy: DraftModel) -> None:
    draft, aligner = onnx_draft(export)
    assert draft.vision.name == "onnx (CPUExecutionProvider, fp32)"
    assert isinstance(toy.vision, TorchVision)
    adapter = load_adapter(TOY_ADAPTER_DIR)
    worst = {"clip": 0.0, "events": 0.0, "adapter": 0.0}
    for seed in SCENES:
        pixels = toy_pixels(toy, seed)  # [5, 3, S, S]
        clip_t, clip_o = toy.clip_features(pixels), draft.clip_features(pixels)
        assert clip_o.shape == clip_t.shape and clip_o.dtype == torch.float32
        with torch.no_grad():
            pairs = {"clip": (clip_o, clip_t),
                     "events": (draft.event_tokens(clip_t), toy.event_tokens(clip_t)),
                     "adapter": (aligner(clip_t), adapter(clip_t))}  # type: ignore[operator]
        for name, (got, want) in pairs.items():
            assert got.shape == want.shape, name
            rel = float((got - want).abs().max() / want.abs().max())
            worst[name] = max(worst[name], rel)
    assert max(worst.values()) < FP32_TOLERANCE, worst
    recorded = read_manifest(export)["max_abs_diff_fp32_cpu"]
    assert set(recorded) == {"clip", "events", "adapter"}
    assert max(recorded.values()) < 1e-4  # absolute, on the export's random example


def greedy(backend: object, draft: DraftModel, pixels: torch.Tensor, n: int = 12) -> list[int]:
    drafter = DraftCache(backend)  # type: ignore[arg-type]
    drafter.prefill(QUESTION, pixels)
    seq: list[int] = []
    while len(seq) < n and (not seq or seq[-1] != draft.eos_token_id):
        seq.append(drafter.draft_next(seq))
    return seq


def test_identical_drafts_from_both_backends(export: Path, toy: DraftModel) -> None:
    """On toy scenes, the HF drafter and the static one draft the same tokens whether
    the event tokens came from torch or from ONNX Runtime."""
    draft, _ = onnx_draft(export, adapter=False)
    static = StaticDraftBackend(draft, max_seq_len=256, use_graphs=False)
    for seed in SCENES[:2]:
        pixels = toy_pixels(toy, seed)
        want = greedy(toy, toy, pixels)
        assert len(want) > 1
        assert greedy(draft, draft, pixels) == want, seed
        assert greedy(static, draft, pixels) == want, seed


def test_a_modified_weight_makes_the_export_stale(export: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(TOY_DRAFT_DIR, model)
    load_onnx_vision(export, model_dir=model, adapter_dir=None, device=torch.device("cpu"))
    weights = load_file(str(model / "model.safetensors"))
    key = "model.visual_projector.0.bias"
    weights[key] = weights[key] + 1e-3
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(FailedPrecondition) as err:
        load_onnx_vision(export, model_dir=model, adapter_dir=None, device=torch.device("cpu"))
    message = err.value.message
    assert str(export) in message and str(model) in message, message
    assert "model.safetensors" in message and "export-onnx" in message, message


def test_another_adapter_or_none_exported_is_refused(export: Path, tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    shutil.copytree(TOY_ADAPTER_DIR, adapter)
    weights = load_file(str(adapter / "adapter.safetensors"))
    weights["cls_proj.bias"] = weights["cls_proj.bias"] + 1.0
    save_file(weights, str(adapter / "adapter.safetensors"))
    with pytest.raises(FailedPrecondition, match="adapter weights sha256") as err:
        load_onnx_vision(export, model_dir=TOY_DRAFT_DIR, adapter_dir=adapter,
                         device=torch.device("cpu"))
    assert str(export) in err.value.message and str(adapter) in err.value.message
    bare = tmp_path / "bare"
    shutil.copytree(export, bare)
    manifest = bare / "export.json"
    manifest.write_text(manifest.read_text().replace('"adapter": {', '"adapter_was": {', 1))
    with pytest.raises(FailedPrecondition, match="holds no adapter"):
        load_onnx_vision(bare, model_dir=TOY_DRAFT_DIR, adapter_dir=TOY_ADAPTER_DIR,
                         device=torch.device("cpu"))


def test_not_an_export_and_wrong_shapes_are_clear(export: Path, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="export-onnx"):
        load_onnx_vision(tmp_path, model_dir=TOY_DRAFT_DIR, adapter_dir=None,
                         device=torch.device("cpu"))
    draft, _ = onnx_draft(export, adapter=False)
    s = draft.image_size
    with pytest.raises(InvalidInput, match="5 event frames"):
        draft.clip_features(torch.zeros(4, 3, s, s))


def test_the_provider_follows_the_device_and_what_is_installed() -> None:
    cuda, cpu = torch.device("cuda:0"), torch.device("cpu")
    assert choose_provider(cuda, [CUDA_EP, CPU_EP]) == (CUDA_EP, "fp16")
    assert choose_provider(cuda, [CPU_EP]) == (CPU_EP, "fp32")
    assert choose_provider(cpu, [CUDA_EP, CPU_EP]) == (CPU_EP, "fp32")
    assert choose_provider(cuda, [TRT_EP, CUDA_EP, CPU_EP], "tensorrt") == (TRT_EP, "fp16")


def test_tensorrt_is_tried_only_when_asked_for_and_listed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cuda = torch.device("cuda:0")
    every = [TRT_EP, CUDA_EP, CPU_EP]
    assert provider_chain(cuda, every) == [CUDA_EP, CPU_EP]
    assert provider_chain(cuda, every, "cuda") == [CUDA_EP]
    assert provider_chain(cuda, every, "tensorrt") == [TRT_EP, CUDA_EP]
    with caplog.at_level(logging.WARNING, logger="eventspec.edge.vision.onnx_backend"):
        assert provider_chain(cuda, [CUDA_EP, CPU_EP], "tensorrt") == [CUDA_EP]
    assert "no TensorRT execution provider" in caplog.text, caplog.text


def test_cuda_and_tensorrt_never_end_on_the_cpu() -> None:
    cuda, cpu = torch.device("cuda:0"), torch.device("cpu")
    for prefer in ("cuda", "tensorrt"):
        with pytest.raises(FailedPrecondition, match="onnxruntime-gpu"):
            provider_chain(cuda, [CPU_EP], prefer)
        with pytest.raises(FailedPrecondition, match="needs a CUDA --device"):
            provider_chain(cpu, [TRT_EP, CUDA_EP, CPU_EP], prefer)
    with pytest.raises(FailedPrecondition, match="one of auto, cuda, tensorrt"):
        provider_chain(cuda, [CUDA_EP], "gpu")
    assert PROVIDER_CHOICES == VISION_ORT_PROVIDERS


def test_a_provider_that_cannot_open_hands_over_to_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tried: list[str] = []
    opened: dict[str, OrtGraph] = {}

    def open_on(provider: str) -> dict[str, OrtGraph]:
        tried.append(provider)
        if provider == TRT_EP:
            raise RuntimeError("libnvinfer.so.10: cannot open shared object file")
        return opened

    with caplog.at_level(logging.WARNING, logger="eventspec.edge.vision.onnx_backend"):
        assert first_that_opens([TRT_EP, CUDA_EP], open_on) == (CUDA_EP, opened)
    assert tried == [TRT_EP, CUDA_EP]
    assert "libnvinfer.so.10" in caplog.text and CUDA_EP in caplog.text, caplog.text


def test_the_export_s_own_failure_and_the_last_provider_s_are_raised() -> None:
    tried: list[str] = []

    def missing(provider: str) -> dict[str, OrtGraph]:
        tried.append(provider)
        raise NotFound("ONNX graph clip.onnx not found")

    with pytest.raises(NotFound):
        first_that_opens([TRT_EP, CUDA_EP, CPU_EP], missing)
    assert tried == [TRT_EP]  # the same file is missing for every provider

    def broken(provider: str) -> dict[str, OrtGraph]:
        raise RuntimeError(f"{provider} broke")

    with pytest.raises(RuntimeError, match=f"{CPU_EP} broke"):
        first_that_opens([CUDA_EP, CPU_EP], broken)


def test_the_name_says_which_graphs_replay_as_cuda_graphs() -> None:
    assert describe(CPU_EP, "fp32", {"clip": False, "events": False}) == (
        "onnx (CPUExecutionProvider, fp32)")
    assert describe(CUDA_EP, "fp16", {"clip": True, "events": True}) == (
        "onnx (CUDAExecutionProvider, fp16, CUDA graphs)")
    assert describe(CUDA_EP, "fp16", {"clip": True, "events": False, "adapter": True}) == (
        "onnx (CUDAExecutionProvider, fp16, CUDA graphs: clip/adapter)")


def test_export_onnx_refuses_a_missing_model(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from eventspec.edge import cli

    assert cli.main(["export-onnx", "--model", str(tmp_path / "none"),
                     "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "export-onnx" in err and str(tmp_path / "none") in err, err
