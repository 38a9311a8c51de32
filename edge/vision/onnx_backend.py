"""The edge's vision path on ONNX Runtime (``--vision-backend onnx --onnx-dir DIR``).

Loads an export made by :mod:`eventspec.edge.vision.onnx_export`, refuses it when it is stale
for the model and adapter the edge loaded
(:func:`~eventspec.edge.vision.onnx_manifest.check_fresh`),
and serves the :class:`~eventspec.edge.vision.backend.VisionBackend` and
:class:`~eventspec.edge.vision.backend.Aligner` roles from its sessions
(:class:`~eventspec.edge.vision.onnx_session.OrtGraph`: bound buffers, CUDA graphs).

The execution provider is chosen at run time (``--vision-ort-provider``) from
``get_available_providers()``: on a CUDA device the CUDA EP with the fp16 fused graphs
(``onnxruntime-gpu``, the ``edge-gpu`` extra), or, when asked for, TensorRT building fp16
engines from the fp32 graphs; else the CPU EP with the fp32 graphs. A provider listed but
unable to open a session (TensorRT without its libraries) is logged and the next one
tried. Tensors stay torch tensors on both sides (no copy through numpy, none off the GPU).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnxruntime
import torch

from eventspec.edge.vision.align import AdapterConfig
from eventspec.edge.vision.onnx_manifest import check_fresh, read_manifest
from eventspec.edge.vision.onnx_session import CPU_EP, CUDA_EP, TRT_EP, OrtGraph
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput, NotFound

__all__ = ["CPU_EP", "CUDA_EP", "GRAPH_FILE", "PRECISION", "PROVIDER_CHOICES", "TRT_EP",
           "OnnxAligner", "OnnxVision", "OnnxVisionPath", "OrtGraph", "choose_provider",
           "describe", "first_that_opens", "load_onnx_vision", "provider_chain",
           "trt_cache_dir"]

log = logging.getLogger(__name__)

#: ``--vision-ort-provider``: auto (CUDA on a CUDA device, else CPU), cuda (the CUDA EP
#: or refuse), tensorrt (TensorRT, else the CUDA EP, else refuse).
PROVIDER_CHOICES = ("auto", "cuda", "tensorrt")
#: Which of the export's files each provider runs, and in what precision it computes.
GRAPH_FILE = {CUDA_EP: "fp16", TRT_EP: "fp32", CPU_EP: "fp32"}
PRECISION = {CUDA_EP: "fp16", TRT_EP: "fp16", CPU_EP: "fp32"}


def provider_chain(device: torch.device, available: list[str],
                   prefer: str = "auto") -> list[str]:
    """The execution providers to try, in order, for a draft on ``device``.

    TensorRT is tried only when ``prefer`` asks for it: it builds its engines at start
    (slowly, for a large graph) and no run here has measured it. ``cuda`` and
    ``tensorrt`` never end on the CPU; ``auto`` does, with a warning when the draft is
    on CUDA.
    """
    if prefer not in PROVIDER_CHOICES:
        raise FailedPrecondition(f"--vision-ort-provider must be one of "
                                 f"{', '.join(PROVIDER_CHOICES)}, got {prefer!r}")
    if device.type != "cuda":
        if prefer != "auto":
            raise FailedPrecondition(f"--vision-ort-provider {prefer} needs a CUDA --device, "
                                     f"got {device}")
        return [CPU_EP]
    chain = []
    if prefer == "tensorrt":
        if TRT_EP in available:
            chain.append(TRT_EP)
        else:
            log.warning("--vision-ort-provider tensorrt: this ONNX Runtime has no TensorRT "
                        "execution provider (providers: %s); trying the CUDA EP",
                        ", ".join(available))
    if CUDA_EP in available:
        chain.append(CUDA_EP)
    elif prefer == "auto":
        log.warning(
            "--vision-backend onnx: the draft runs on %s but this ONNX Runtime has no CUDA "
            "execution provider (providers: %s), so the vision path runs on the CPU. "
            "Install the edge-gpu extra (onnxruntime-gpu) after uninstalling onnxruntime.",
            device, ", ".join(available))
    if prefer == "auto":
        chain.append(CPU_EP)
    if not chain:
        raise FailedPrecondition(
            f"--vision-ort-provider {prefer}: this ONNX Runtime has no CUDA execution "
            f"provider (providers: {', '.join(available)}); install the edge-gpu extra "
            "(onnxruntime-gpu)")
    return chain


def choose_provider(device: torch.device, available: list[str],
                    prefer: str = "auto") -> tuple[str, str]:
    """(execution provider, compute precision) the chain for ``device`` starts with.

    CUDA runs the fp16 graphs; CPU the fp32 ones (fp16 has few CPU kernels and no gain).
    """
    first = provider_chain(device, available, prefer)[0]
    return first, PRECISION[first]


def first_that_opens(chain: list[str], open_on: Callable[[str], dict[str, OrtGraph]]
                     ) -> tuple[str, dict[str, OrtGraph]]:
    """The first provider of ``chain`` whose graphs open, and the graphs.

    A failure other than the export's own (a missing graph file, a wrong shape: the same
    on every provider) is logged with its reason and the next provider tried; the last
    one's failure is raised.
    """
    for i, provider in enumerate(chain):
        try:
            return provider, open_on(provider)
        except (NotFound, InvalidInput):
            raise
        except Exception as exc:
            if i + 1 == len(chain):
                raise
            log.warning("--vision-backend onnx: %s could not run the export (%s: %s); "
                        "trying %s", provider, type(exc).__name__, exc, chain[i + 1])
    raise FailedPrecondition("--vision-backend onnx: no execution provider to try")


def trt_cache_dir() -> Path:
    """Where TensorRT's engines and timing cache go: ``$XDG_CACHE_HOME/eventspec/ort-trt``."""
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "eventspec" / "ort-trt"


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
    edge loads one), the provider and compute precision chosen, and which graphs run
    as CUDA graphs (name -> on)."""

    vision: OnnxVision
    aligner: OnnxAligner | None
    provider: str
    precision: str
    cuda_graphs: dict[str, bool]

    @property
    def cuda_graph(self) -> bool:
        """Whether every graph runs as a CUDA graph."""
        return all(self.cuda_graphs.values())


def describe(provider: str, precision: str, cuda_graphs: dict[str, bool]) -> str:
    """The vision backend's name: ``onnx (provider, precision[, CUDA graphs])``; when only
    some graphs captured, which."""
    on = [name for name, ok in cuda_graphs.items() if ok]
    graphs = ("" if not on else ", CUDA graphs" if len(on) == len(cuda_graphs)
              else f", CUDA graphs: {'/'.join(on)}")
    return f"onnx ({provider}, {precision}{graphs})"


def load_onnx_vision(export_dir: Path, *, model_dir: Path, adapter_dir: Path | None,
                     device: torch.device, prefer: str = "auto",
                     cuda_graphs: bool = True) -> OnnxVisionPath:
    """Open the export in ``export_dir`` for the model (and adapter) the edge loaded.

    Refuses a stale export (FailedPrecondition naming both directories) and one without
    the adapter graph when ``adapter_dir`` is given. ``prefer`` is
    ``--vision-ort-provider``, ``cuda_graphs`` ``--vision-ort-cuda-graphs``.
    """
    manifest = read_manifest(export_dir)
    check_fresh(export_dir, manifest, model_dir, adapter_dir)
    chain = provider_chain(device, onnxruntime.get_available_providers(), prefer)
    files = manifest["graphs"]
    names = ["clip", "events", *(["adapter"] if adapter_dir is not None else [])]

    def open_on(provider: str) -> dict[str, OrtGraph]:
        cache = trt_cache_dir() if provider == TRT_EP else None
        return {name: OrtGraph(export_dir / files[name][GRAPH_FILE[provider]], provider,
                               device, cuda_graph=cuda_graphs, trt_cache=cache)
                for name in names}

    provider, graphs = first_that_opens(chain, open_on)
    precision = PRECISION[provider]
    on = {name: g.cuda_graph for name, g in graphs.items()}
    name = describe(provider, precision, on)
    vision = OnnxVision(graphs["clip"], graphs["events"], device, name)
    aligner = None
    if adapter_dir is not None:
        raw = dict(manifest["adapter"]["config"])
        raw.pop("format_version", None)
        aligner = OnnxAligner(graphs["adapter"], AdapterConfig(**raw))
    log.info("vision path: ONNX Runtime %s, %s, from %s", onnxruntime.__version__, name,
             export_dir)
    return OnnxVisionPath(vision, aligner, provider, precision, on)
