"""An engine wrapper that makes prefill and steps take at least a given time.

This rehearses a slower cloud on a fast or small machine: for example the toy models on
a laptop CPU step in a few milliseconds, while a 7B target on an A100 takes about 30 ms
per token (the design notes' figure). With ``--emulate-step-ms 30`` the verifier paces
each forward to that floor, and the shared timing plan sees the ratio c = t_draft /
t_step that a real deployment would have. The output is unchanged: only the wall time of
each call is padded.

A batched step costs what a real GPU step of that shape costs, scaled: ``step_ms`` is the
one-session, one-token step, and each extra session and each extra token fed adds the
fraction of it that the static engine measured on an H200
(``benchmarks/results/engine_h200_run6.json``: a relative least-squares fit of its 20
(B, k) steps, anchored at the single-token step, gives 4.4% of it per extra session and
0.33% per token fed; every measured step is then within 13%; on the later run in
``engine_h200.json`` within 16%, B = 64 with 16 drafts the furthest). A flat floor would
let B = 16 sessions with 8 drafts each step as fast as one token alone and flatter
every toy-world speedup.

The costs are known by construction, so the verifier plans with :meth:`known_cost`
instead of timing the paced engine (timings on a busy machine only add noise to them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from eventspec.cloud.engine.base import BatchedEngine, KvByLengthEngine, PrefillRequest
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.node.static.batch import StepBatch

#: Extra cost of each session beyond the first, as a fraction of the single-token step.
SESSION_FRACTION = 0.044
#: Extra cost of each token fed, as a fraction of the single-token step.
TOKEN_FRACTION = 0.0033


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
        #: KV by length passes through (``eventspec.cloud.scheduling.kv_arena``).
        self.kv_positions: int | None = getattr(inner, "kv_positions", None)

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

    def known_cost(self) -> CloudCost:
        """The cost model this engine is paced to (what the plan should use)."""
        per_token = self.step_ms * TOKEN_FRACTION
        return CloudCost(
            prefill_base_ms=self.prefill_ms,
            prefill_ms_per_visual_token=0.0,
            prefill_ms_per_text_token=0.0,
            step_base_ms=max(self.step_ms - per_token, 1e-3),
            step_ms_per_token=per_token,
            step_ms_per_session=self.step_ms * SESSION_FRACTION,
            device="paced",
            calibration=f"paced engine, known costs ({self.prefill_ms:g} ms prefill, "
                        f"{self.step_ms:g} ms per single-token step)",
        )

    def step_floor_ms(self, sessions: int, tokens: int) -> float:
        """The paced time of one step over ``sessions`` sessions feeding ``tokens``."""
        if self.step_ms <= 0:
            return 0.0
        return self.known_cost().batch_step_ms(sessions, tokens)

    def step(self, batch: StepBatch) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.inner.step(batch)
        self._pad(t0, self.step_floor_ms(len(batch.slots), sum(batch.counts)))
        return out

    def free(self, slot: int) -> None:
        self.inner.free(slot)

    def reserve(self, slot: int, positions: int) -> None:
        """KV by length: the inner engine's reservation (only called when it has one)."""
        assert isinstance(self.inner, KvByLengthEngine)
        self.inner.reserve(slot, positions)
