"""An engine wrapper that makes prefill and steps take at least a given time.

This rehearses a slower cloud on a fast or small machine: for example the toy models on
a laptop CPU step in a few milliseconds, while a 7B target on an A100 takes about 30 ms
per token (the design notes' figure). With ``--emulate-step-ms 30`` the verifier paces
each forward to that floor, calibration measures the paced engine, and the shared
timing plan sees the ratio c = t_draft / t_step that a real deployment would have.
The output is unchanged: only the wall time of each call is padded.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from cloud.engine.base import EngineState, TargetEngine


class PacedEngine:
    """``TargetEngine`` whose prefill and step calls last at least the given times."""

    def __init__(self, inner: TargetEngine, *, prefill_ms: float, step_ms: float) -> None:
        if prefill_ms < 0 or step_ms < 0:
            raise ValueError("emulated times must be >= 0 ms")
        self.inner = inner
        self.prefill_ms = prefill_ms
        self.step_ms = step_ms

    @staticmethod
    def _pad(started: float, floor_ms: float) -> None:
        remaining = floor_ms / 1e3 - (time.perf_counter() - started)
        if remaining > 0:
            time.sleep(remaining)

    def prefill(
        self, input_ids: Sequence[int], **visual: Any
    ) -> tuple[EngineState, torch.Tensor]:
        t0 = time.perf_counter()
        out = self.inner.prefill(input_ids, **visual)
        self._pad(t0, self.prefill_ms)
        return out

    def step(self, state: EngineState, tokens: Sequence[int]) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.inner.step(state, tokens)
        self._pad(t0, self.step_ms)
        return out

    def rollback(self, state: EngineState, keep_len: int) -> None:
        self.inner.rollback(state, keep_len)

    def release(self, state: EngineState) -> None:
        self.inner.release(state)

    def seq_len(self, state: EngineState) -> int:
        return self.inner.seq_len(state)
