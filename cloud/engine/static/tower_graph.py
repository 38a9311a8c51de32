"""Video-LLaVA's video tower and projector replayed from one CUDA graph.

A clip's input has one shape ([F, 3, S, S] pixels), so the tower (CLIP ViT-L/14, 24
layers of HF eager modules) and the projector can be captured once and replayed. Why:
eager, the tower is launch-bound: on an H100 the tower, projector and splice of 8 frames
took 11.1 ms, and 4.9 ms with the graph, which gives the same bits
(``benchmarks/bench_engine.py --prefill-only``, ``prefill-h100.json``). vLLM and SGLang
capture decode steps this way; the tower's fixed shape lets the same trick serve the
prefill.
"""

from __future__ import annotations

import logging

import torch

from eventspec.cloud.target import TargetModel

logger = logging.getLogger(__name__)

__all__ = ["TowerGraph"]


class TowerGraph:
    """Pixels [F, 3, S, S] -> projected video features [F T, H], one graph replay."""

    def __init__(self, target: TargetModel, stream: torch.cuda.Stream | None = None) -> None:
        """Capture the tower and projector on ``target``'s CUDA device (build it before
        serving: capture must not overlap other work on the device). ``stream``: the
        side stream it will be replayed on (:class:`eventspec.cloud.engine.ahead.SideStream`);
        capturing on it, not on the step graphs' capture stream, gives the graph
        cuBLAS workspaces of its own, so a replay beside a step's shares none."""
        g = target.geometry
        self.target = target
        self._pixels = torch.zeros(g.num_frames, 3, g.image_size, g.image_size,
                                   device=target.device, dtype=target.dtype)  # [F, 3, S, S]
        if stream is None:
            stream = torch.cuda.Stream(target.device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(target.device))
        with torch.cuda.stream(stream), torch.inference_mode():
            self._run()  # cuBLAS / cuDNN plans outside the capture
        torch.cuda.current_stream(target.device).wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self._graph, stream=stream):
            self._out = self._run()  # [F T, H]

    def _run(self) -> torch.Tensor:
        t = self.target
        feats = t.video_features_from_pixels(self._pixels)  # [F, T, Dv]
        projected: torch.Tensor = t.model.model.multi_modal_projector(feats)  # [F, T, H]
        return projected.reshape(-1, projected.shape[-1])  # [F T, H]

    def __call__(self, pixel_values_videos: torch.Tensor) -> torch.Tensor:
        """Projected features [F T, H] of checked pixels ([1, F, 3, S, S] or [F, 3, S, S];
        ``TargetModel.video_pixels`` names a wrong shape). The result is the graph's own
        buffer: use it before the next call."""
        self._pixels.copy_(self.target.video_pixels(pixel_values_videos))
        self._graph.replay()
        return self._out
