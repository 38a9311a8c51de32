"""An engine wrapper that makes prefill and steps take at least a given time.

This rehearses a slower cloud on a fast or small machine: for example the toy models on
a laptop CPU step in a few milliseconds, while a 7B target on an A100 takes about 30 ms
per token (the design notes' figure). With ``--emulate-step-ms 30`` the verifier paces
each forward to that floor, calibration measures the paced engine, and the shared
timing plan sees the ratio c = t_draft / t_step that a real deployment would have.
The output is unchanged: only the wall time of each call is padded. A batched step is
paced once, like one forward of a batching engine.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from cloud.engine.base import BatchedEngine, PrefillRequest, StepBatch


class PacedEngine:
    """``BatchedEngine`` whose prefill and step calls last at least the given times."""

    def __init__(self, inner: BatchedEngine, *, prefill_ms: float, step_ms: float) -> None:
        if prefill_ms < 0 or step_ms < 0:
            raise ValueError("emulated times must be >= 0 ms")
        self.inner = inner
        self.prefill_ms = prefill_ms
        self.step_ms = step_ms
        self.device: torch.device = inner.device
        self.num_slots = inner.num_slots
        self.max_seq_len = inner.max_seq_len

    @staticmethod
    def _pad(started: float, floor_ms: float) -> None:
        remaining = floor_ms / 1e3 - (time.perf_counter() - started)
        if remaining > 0:
            time.sleep(remaining)

    def prefill(self, requests: Sequence[PrefillRequest]) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.inner.prefill(requests)
        self._pad(t0, self.prefill_ms)
        return out

    def step(self, batch: StepBatch) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.inner.step(batch)
        self._pad(t0, self.step_ms)
        return out

    def free(self, slot: int) -> None:
        self.inner.free(slot)
