"""The edge's vision path on ONNX Runtime (``--vision-backend onnx --onnx-dir DIR``).

Loads an export made by :mod:`eventspec.edge.vision.onnx_export`, refuses it when it is stale
for the model and adapter the edge loaded
(:func:`~eventspec.edge.vision.onnx_manifest.check_fresh`),
and serves the :class:`~eventspec.edge.vision.backend.VisionBackend` and
:class:`~eventspec.edge.vision.backend.Aligner` roles from its sessions.

The execution provider is chosen at run time from ``get_available_providers()``: CUDA
with the fp16 fused graphs when it is there and the draft runs on a CUDA device
(``onnxruntime-gpu``, the ``edge-gpu`` extra), else CPU with the fp32 graphs. Tensors
stay torch tensors on both sides: inputs and outputs are bound in place with an
``IOBinding`` (no copy through numpy, none off the GPU).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import torch

from eventspec.edge.vision.align import AdapterConfig
from eventspec.edge.vision.onnx_manifest import check_fresh, read_manifest
from eventspec.shared.contract.errors import InvalidInput, NotFound

log = logging.getLogger(__name__)

CUDA_EP = "CUDAExecutionProvider"
CPU_EP = "CPUExecutionProvider"


def choose_provider(device: torch.device, available: list[str]) -> tuple[str, str]:
    """(execution provider, graph precision) for a draft on ``device``.

    CUDA runs the fp16 graphs; CPU the fp32 ones (fp16 has few CPU kernels and no gain).
    """
    if device.type == "cuda" and CUDA_EP in available:
        return CUDA_EP, "fp16"
    if device.type == "cuda":
        log.warning(
            "--vision-backend onnx: the draft runs on %s but this ONNX Runtime has no CUDA "
            "execution provider (providers: %s), so the vision path runs on the CPU. "
            "Install the edge-gpu extra (onnxruntime-gpu) after uninstalling onnxruntime.",
            device, ", ".join(available))
    return CPU_EP, "fp32"


class OrtGraph:
    """One ONNX graph with a float32 input and output of fixed shapes, run on torch tensors."""

    def __init__(self, path: Path, provider: str, device: torch.device) -> None:
        if not path.is_file():
            raise NotFound(f"ONNX graph {path} not found; re-run `eventspec-edge export-onnx`")
        self.path = path
        self.device = device if provider == CUDA_EP else torch.device("cpu")
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3  # warnings about unused initializers are noise
        providers: list[Any] = [provider]
        if provider == CUDA_EP:
            providers = [(CUDA_EP, {"device_id": self.device.index or 0})]
        self.session = onnxruntime.InferenceSession(str(path), options, providers=providers)
        inp, out = self.session.get_inputs()[0], self.session.get_outputs()[0]
        self.input_name, self.output_name = inp.name, out.name
        self.input_shape = tuple(int(d) for d in inp.shape)
        self.output_shape = tuple(int(d) for d in out.shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x of the graph's input shape (any dtype, any device) -> float32 output on the
        session's device."""
        if tuple(x.shape) != self.input_shape:
            raise InvalidInput(
                f"the ONNX graph {self.path.name} takes {list(self.input_shape)}, got "
                f"{list(x.shape)} (an export has fixed shapes: 5 event frames)"
            )
        x = x.detach().to(self.device, torch.float32).contiguous()
        out = torch.empty(self.output_shape, dtype=torch.float32, device=self.device)
        kind, index = self.device.type, self.device.index or 0
        if kind == "cuda":
            # ORT runs on its own stream: what torch queued into x must be done first.
            torch.cuda.current_stream(self.device).synchronize()
        binding = self.session.io_binding()
        binding.bind_input(self.input_name, kind, index, np.float32, self.input_shape,
                           x.data_ptr())
        binding.bind_output(self.output_name, kind, index, np.float32, self.output_shape,
                            out.data_ptr())
        self.session.run_with_iobinding(binding)  # synchronises its stream on return
        return out


class OnnxVision:
    """:class:`~eventspec.edge.vision.backend.VisionBackend` on ONNX Runtime sessions."""

    def __init__(self, clip: OrtGraph, events: OrtGraph, device: torch.device,
                 name: str) -> None:
        self.clip, self.events, self.device, self.name = clip, events, device, name

    def clip_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.clip(pixel_values).to(self.device)  # [5, T, Dv]

    def event_tokens(self, clip_features: torch.Tensor) -> torch.Tensor:
        return self.events(clip_features).to(self.device)  # [5 + T, H]


class OnnxAligner:
    """:class:`~eventspec.edge.vision.backend.Aligner` on an ONNX Runtime session."""

    def __init__(self, graph: OrtGraph, config: AdapterConfig) -> None:
        self.graph, self.config = graph, config

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        return self.graph(features)  # [F_t, T_t, D_t]


@dataclass(frozen=True)
class OnnxVisionPath:
    """What ``--vision-backend onnx`` runs: the vision backend, the adapter (when the
    edge loads one), and the provider and precision chosen."""

    vision: OnnxVision
    aligner: OnnxAligner | None
    provider: str
    precision: str


def load_onnx_vision(export_dir: Path, *, model_dir: Path, adapter_dir: Path | None,
                     device: torch.device) -> OnnxVisionPath:
    """Open the export in ``export_dir`` for the model (and adapter) the edge loaded.

    Refuses a stale export (FailedPrecondition naming both directories) and one without
    the adapter graph when ``adapter_dir`` is given.
    """
    manifest = read_manifest(export_dir)
    check_fresh(export_dir, manifest, model_dir, adapter_dir)
    provider, precision = choose_provider(device, onnxruntime.get_available_providers())
    files = manifest["graphs"]

    def graph(name: str) -> OrtGraph:
        return OrtGraph(export_dir / files[name][precision], provider, device)

    name = f"onnx ({provider}, {precision})"
    vision = OnnxVision(graph("clip"), graph("events"), device, name)
    aligner = None
    if adapter_dir is not None:
        raw = dict(manifest["adapter"]["config"])
        raw.pop("format_version", None)
        aligner = OnnxAligner(graph("adapter"), AdapterConfig(**raw))
    log.info("vision path: ONNX Runtime %s, %s, from %s", onnxruntime.__version__, name,
             export_dir)
    return OnnxVisionPath(vision, aligner, provider, precision)
