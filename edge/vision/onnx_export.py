"""``eventspec-edge export-onnx``: the edge's vision path as ONNX graphs plus a manifest.

Three graphs, each with the fixed shapes one request uses (the event window is always
rendered as 5 frames, so the batch is fixed at 5 and no dynamic axes are needed):

- ``clip``: pixels [5, 3, S, S] -> CLIP last layer [5, T, Dv];
- ``events``: CLIP features [5, T, Dv] -> event tokens [5 + T, H] (projector, feature
  adaptor, EventGPT's pooling);
- ``adapter``: CLIP features [5, T, Dv] -> Video-LLaVA's pre-projector features
  [F_t, T_t, D_t] (only with ``--adapter``).

The split follows the seam (:mod:`eventspec.edge.vision.backend`): the aligned path
runs CLIP once and feeds its features to both the adapter and the drafter's prefill.

Each graph is written twice: fp32 (the reference; the CPU execution provider runs it)
and fp16 after ONNX Runtime's transformer optimizer has fused CLIP's attention,
LayerNorm and QuickGELU (the CUDA execution provider runs it; a plain fp16 graph of
CLIP-L/14-336 was slower than torch eager on an H100). Inputs and outputs stay float32
in both, so callers never see the difference.

Why the TorchScript exporter (``dynamo=False``): with torch 2.13 it needs only the
``onnx`` package (the dynamo exporter also wants ``onnxscript``), it exports CLIP and the
projector in well under a second at the toy size, and ONNX Runtime's optimizer matches
its attention pattern. CLIP is traced with eager attention for that reason: SDPA
traces to a pattern the optimizer does not fuse. The adapter's antialiased bilinear
resize has no ONNX symbolic in that exporter; it is a fixed linear map, so the export
replaces it (and the linear time interpolation) by two constant matrices computed from
the adapter's own resampling (:class:`MatrixAdapter`), exact up to rounding.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import onnxruntime
import torch
from onnxruntime.transformers.float16 import convert_float_to_float16
from onnxruntime.transformers.optimizer import optimize_model
from torch import nn
from torch.jit._trace import TracerWarning

from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.drafting.eventgpt import (
    N_EVENT_FRAMES,
    EventGPTConfig,
    EventGPTForCausalLM,
    clip_config_of,
    image_size_of,
)
from eventspec.edge.vision.align import FeatureAdapter, load_adapter
from eventspec.edge.vision.onnx_manifest import MANIFEST_NAME, sources_of, write_manifest
from eventspec.shared.contract.errors import InvalidInput

log = logging.getLogger(__name__)

#: ONNX opset of the export; 17 has LayerNormalization, which the optimizer fuses into.
DEFAULT_OPSET = 17
INPUT, OUTPUT = "input", "output"


class ClipGraph(nn.Module):
    """[5, 3, S, S] -> [5, T, Dv]: the CLIP tower as the drafter runs it."""

    def __init__(self, model: EventGPTForCausalLM) -> None:
        super().__init__()
        self.tower = model.event_model.visual_tower

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.tower(pixel_values)
        return out


class EventsGraph(nn.Module):
    """[5, T, Dv] -> [5 + T, H]: projector, feature adaptor and pooling."""

    def __init__(self, model: EventGPTForCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, clip_features: torch.Tensor) -> torch.Tensor:
        return self.model.event_tokens(clip_features)


class MatrixAdapter(nn.Module):
    """The feature adapter with its resampling as two matrices: [F_s, T_s, D_s] -> [F_t, T_t, D_t].

    ``FeatureAdapter.resample_grid`` and ``resample_time`` are linear and act alike on
    every channel, so each is the matrix they map an identity basis to: ``grid`` [T_t,
    T_s] over tokens (CLS passes through), ``time`` [F_t, F_s] over frames. The channel
    maps, MLP and mixer are the adapter's own modules.
    """

    def __init__(self, adapter: FeatureAdapter) -> None:
        super().__init__()
        cfg = adapter.config
        self.adapter = adapter
        with torch.no_grad():
            basis = torch.eye(cfg.src_tokens).view(cfg.src_tokens, 1, cfg.src_tokens, 1)
            grid = adapter.resample_grid(basis)[:, 0, :, 0].T  # [T_t, T_s]
            frames = torch.eye(cfg.src_frames).view(cfg.src_frames, cfg.src_frames, 1, 1)
            times = adapter.resample_time(frames)[:, :, 0, 0].T  # [F_t, F_s]
        self.grid: torch.Tensor
        self.time: torch.Tensor
        self.register_buffer("grid", grid.contiguous())
        self.register_buffer("time", times.contiguous())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = self.grid @ features  # [F_s, T_t, D_s]
        f_s, t_t, d = x.shape
        x = (self.time @ x.reshape(f_s, t_t * d)).reshape(-1, t_t, d)  # [F_t, T_t, D_s]
        return self.adapter.project(x.unsqueeze(0)).squeeze(0)  # [F_t, T_t, D_t]


@dataclass(frozen=True)
class ExportResult:
    """Where the export went, and how close each fp32 graph came to torch on CPU."""

    out: Path
    manifest: Path
    max_abs_diff: dict[str, float]
    seconds: float


@dataclass(frozen=True)
class Graphs:
    """The graphs written: file names per graph and precision, and what the manifest
    says about them."""

    files: dict[str, dict[str, str]]
    max_abs_diff: dict[str, float]
    fused: dict[str, int]
    fields: dict[str, Any]


def export_graphs(model: EventGPTForCausalLM, adapter: FeatureAdapter | None, out: Path, *,
                  opset: int = DEFAULT_OPSET) -> Graphs:
    """Trace the vision path of ``model`` (fp32, on the CPU) and ``adapter`` into ``out``.

    Each fp32 graph is run once on ONNX Runtime's CPU execution provider against torch
    on the same input; the largest difference is returned for the manifest. ``model``
    is moved to the CPU in fp32 and its CLIP set to eager attention: pass a model
    loaded for the export.
    """
    model = nn.Module.to(model, device="cpu", dtype=torch.float32)
    model.train(False)
    config = model.config
    if not isinstance(config, EventGPTConfig):
        raise InvalidInput(f"expected an EventGPTConfig, got {type(config).__name__}")
    clip_cfg = clip_config_of(config)
    s = image_size_of(clip_cfg)
    # Eager attention traces to the MatMul/Softmax pattern ORT's optimizer fuses.
    model.event_model.visual_tower.visual_tower.set_attn_implementation("eager")
    pixels = torch.randn(N_EVENT_FRAMES, 3, s, s,
                         generator=torch.Generator().manual_seed(0))  # [5, 3, S, S]
    with torch.no_grad():
        clip = model.clip_features(pixels)  # [5, T, Dv]
    graphs: list[tuple[str, nn.Module, torch.Tensor]] = [
        ("clip", ClipGraph(model), pixels), ("events", EventsGraph(model), clip)]
    adapter_info: dict[str, Any] | None = None
    if adapter is not None:
        adapter = adapter.float().cpu().eval()
        if adapter.config.src != tuple(clip.shape):
            raise InvalidInput(
                f"the adapter reads features {list(adapter.config.src)}, the model makes "
                f"{list(clip.shape)}"
            )
        graphs.append(("adapter", MatrixAdapter(adapter), clip))
        adapter_info = {"output_shape": list(adapter.config.dst)}
    files: dict[str, dict[str, str]] = {}
    diffs: dict[str, float] = {}
    fused: dict[str, int] = {}
    for name, module, example in graphs:
        fp32, fp16 = out / f"{name}.onnx", out / f"{name}.fp16.onnx"
        _export_graph(module.eval(), example, fp32, opset)
        diffs[name] = _parity(module, example, fp32)
        if name == "clip":
            fused = _fp16_fused_clip(fp32, fp16, clip_cfg.num_attention_heads,
                                     clip_cfg.hidden_size)
        else:
            _fp16_plain(fp32, fp16)
        files[name] = {"fp32": fp32.name, "fp16": fp16.name}
        log.info("exported %s: max |onnx - torch| %.2e (fp32, CPU)", name, diffs[name])
    fields = {
        "frames": N_EVENT_FRAMES,
        "image_size": s,
        "clip_features_shape": list(clip.shape),
        "event_tokens_shape": [N_EVENT_FRAMES + int(clip.shape[1]),
                               int(model.config.hidden_size)],
        "adapter_graph": adapter_info,
    }
    return Graphs(files, diffs, fused, fields)


def export_onnx(model_dir: Path, adapter_dir: Path | None, out: Path, *,
                opset: int = DEFAULT_OPSET) -> ExportResult:
    """Export the vision path of the checkpoint in ``model_dir`` (and the adapter in
    ``adapter_dir``) into ``out``: fp32 and fp16 graphs, then ``export.json`` last, so an
    interrupted export is never taken for a finished one."""
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    sources = sources_of(model_dir, adapter_dir)
    draft = load_draft(model_dir, device="cpu", dtype=torch.float32)
    adapter = load_adapter(adapter_dir) if adapter_dir is not None else None
    graphs = export_graphs(draft.model, adapter, out, opset=opset)
    manifest = write_manifest(
        out, sources,
        graphs=graphs.files,
        **graphs.fields,
        opset=opset,
        exporter="torch.onnx.export (TorchScript, dynamo=False)",
        fp16_fused_operators=graphs.fused,
        max_abs_diff_fp32_cpu=graphs.max_abs_diff,
        versions={"torch": torch.__version__, "onnx": onnx.__version__,
                  "onnxruntime": onnxruntime.__version__},
        source_dirs={"model": str(model_dir), "adapter": str(adapter_dir) if adapter_dir else None},
    )
    return ExportResult(out, manifest, graphs.max_abs_diff, time.perf_counter() - t0)


def _export_graph(module: nn.Module, example: torch.Tensor, path: Path, opset: int) -> None:
    """Trace ``module`` on ``example`` with fixed shapes into ``path``.

    Gradients stay on while tracing: in inference mode nn.TransformerEncoder (the
    adapter's mixer) takes its fused fast path, which has no ONNX symbolic. The tracer's
    warnings (shape checks frozen as constants, the exporter's deprecation notice) are
    expected for fixed shapes and silenced.
    """
    with torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, (example,), str(path), dynamo=False, opset_version=opset,
                          input_names=[INPUT], output_names=[OUTPUT], do_constant_folding=True)


def _parity(module: nn.Module, example: torch.Tensor, path: Path) -> float:
    """max |ORT CPU - torch| of the fp32 graph on the export's own example input."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {INPUT: example.numpy()})[0])
    with torch.no_grad():
        want = module(example)
    return float((got - want).abs().max())


def _fp16_fused_clip(fp32: Path, fp16: Path, heads: int, hidden: int) -> dict[str, int]:
    """CLIP with attention / LayerNorm / QuickGELU fused for the CUDA EP, in fp16 with
    float32 inputs and outputs. opt_level 0: only the optimizer's Python fusions, so no
    GPU is needed to export. Returns the fused operator counts."""
    optimized = optimize_model(str(fp32), model_type="clip", num_heads=heads,
                               hidden_size=hidden, opt_level=0, use_gpu=True)
    stats = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
    optimized.convert_float_to_float16(keep_io_types=True)
    optimized.save_model_to_file(str(fp16))
    return stats


def _fp16_plain(fp32: Path, fp16: Path) -> None:
    """The small graphs (projector, adapter) in fp16 with float32 inputs and outputs."""
    onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(fp16))
