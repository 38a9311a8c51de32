"""Capturing one CUDA graph of a forward (the runtime's warm-up, step and mixed graphs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["capture_graph", "step_graph_shapes"]


def capture_graph(device: torch.device, pool: Any, forward: Callable[[], object]
                  ) -> torch.cuda.CUDAGraph:
    """Run ``forward`` once on a side stream (it compiles / JITs outside the capture),
    then capture it into a graph in the memory ``pool`` (PyTorch's warm-up-then-capture
    recipe for ``torch.cuda.graph``). ``forward`` works on static addresses only."""
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        forward()  # compiles / JITs outside the capture
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        forward()
    return graph


def step_graph_shapes(session_buckets: Sequence[int], token_buckets: Sequence[int]
                      ) -> list[tuple[int, int]]:
    """Every (sessions, tokens) bucket, largest first: captured in that order into one
    pool, the largest bucket's activations are reused by every smaller graph."""
    return sorted(((bp, qp) for bp in session_buckets for qp in token_buckets),
                  key=lambda s: -s[0] * s[1])
