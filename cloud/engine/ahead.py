"""A prompt's embeddings made ahead, on a side CUDA stream, while steps go on.

Why: a prompt's first piece used to run its video tower (CLIP ViT-L/14 over 8 frames,
then the projector) inside the step that carried it. On an H200 at 8 requests/s that
step took 22.2 ms of device time against 7.7 for a plain one, and every session gap at
or over the inter-token latency's p99 followed such a step
(``benchmarks/results/load-h200-step-kinds.json``). Here the tower starts on a stream of
its own once the first step after the prompt's arrival is launched
(``EngineLoop._start_towers``), and the prompt's first piece waits until it has finished
(:attr:`AheadEmbeds.ready`); the steps that run meanwhile do not wait for it. The
engine thread's own stream (:func:`engine_stream`) has a higher priority, so the step's
kernels take the GPU's multiprocessors ahead of the tower's queued blocks; the tower
fills what the step leaves idle. vLLM's encoder cache makes the same split (the
encoder's output kept apart from the decoder's steps); the side stream is the CUDA way
to overlap the two on one device. Measured on an H200 at 8 requests/s: the ITL p99 ÷
p50 2.07 with 512-row pieces against 2.46 with the tower inside the step
(``benchmarks/results/load-h200-towers-ahead.json``).

On the CPU there is no stream: the embeddings are made at once and are ready.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["AheadEmbeds", "SideStream", "engine_stream", "index_tensor"]


@dataclass(eq=False)
class AheadEmbeds:
    """Embeddings [L - start, H] enqueued on a side stream; ``event`` marks their end
    (None: made synchronously, ready)."""

    tensor: torch.Tensor  # [L - start, H]
    start: int  # the prompt row the tensor starts at
    event: Any | None = None  # torch.cuda.Event

    @property
    def ready(self) -> bool:
        """The side stream has finished them (asks the device; never blocks)."""
        return self.event is None or bool(self.event.query())

    def take(self) -> torch.Tensor:
        """The embeddings, for use on the caller's current stream: that stream waits for
        the side stream's work on the device (the host does not block), and the memory
        is held until the current stream's work queued so far is done with it."""
        if self.event is not None and self.tensor.is_cuda:
            stream = torch.cuda.current_stream(self.tensor.device)
            stream.wait_event(self.event)
            self.tensor.record_stream(stream)
        self.event = None
        return self.tensor


class SideStream:
    """One side stream of ``device`` that work can be enqueued on (none on a CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream: torch.cuda.Stream | None = (
            torch.cuda.Stream(device) if device.type == "cuda" else None)  # type: ignore[no-untyped-call]

    def run(self, make: Callable[[], torch.Tensor], start: int) -> AheadEmbeds:
        """``make()`` enqueued on the side stream after what the caller's stream holds
        so far (its inputs), with an event at its end; on a CPU, run now."""
        if self.stream is None:
            return AheadEmbeds(make(), start)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            out = make()
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self.stream)
        return AheadEmbeds(out, start, event)

    def now(self, make: Callable[[], torch.Tensor], start: int = 0) -> torch.Tensor:
        """``make()`` on the side stream, handed to the caller's stream at once (every
        use of the tower goes through the side stream: its graph's buffers are one)."""
        return self.run(make, start).take()


def index_tensor(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device`` ([len(values)]). On a GPU it is copied
    from pinned host memory without blocking the host: a copy from pageable memory made
    the engine thread wait for the work already queued on the side stream (the tower it
    had just launched) before it could go on to the next step."""
    host = torch.tensor([int(v) for v in values], dtype=torch.long)  # [N]
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


@contextlib.contextmanager
def engine_stream(device: torch.device) -> Iterator[None]:
    """Run the engine thread's work on a stream of the device's highest priority (a
    no-op on a CPU), so its steps go ahead of a side stream's queued work."""
    if device.type != "cuda":
        yield
        return
    _, highest = torch.cuda.Stream.priority_range()  # type: ignore[call-arg]
    stream = torch.cuda.Stream(device, priority=highest)  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(device).wait_stream(stream)
