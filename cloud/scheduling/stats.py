"""What the engine loop reports about itself: counters and a per-step hook.

``SchedulerStats`` is read by the benchmark and by ``Verifier.GetStats``
(``eventspec.cloud.live_stats``); a :class:`StepObserver` (``eventspec.cloud.metrics``)
hears of each step as it happens. Each step is also counted by kind
(``eventspec.cloud.scheduling.step_kind_stats``). Kept apart from the scheduler
(``eventspec.cloud.scheduling.step_scheduler``, which counts prefills) and the engine loop
(``eventspec.cloud.scheduling.engine_loop``, which times steps), so its readers depend on the
numbers, not on the loop.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Protocol

from eventspec.cloud.scheduling.step_kind_stats import StepKindStats
from eventspec.cloud.scheduling.step_kinds import StepKind


@dataclass
class SchedulerStats:
    """What the loop did (for the benchmark and the logs)."""

    steps: int = 0
    prefills: int = 0
    step_tokens: int = 0
    batch_sizes: collections.Counter[int] = field(default_factory=collections.Counter)
    engine_ms: float = 0.0  # host time of engine.step calls (launch time on CUDA)
    engine_device_ms: float = 0.0  # the device's time on them (``DeviceTimer``)
    device_timed_steps: int = 0  # steps whose device time was read
    sampler_ms: float = 0.0
    overhead_ms: float = 0.0  # the loop's own Python work around engine and sampler
    prefill_ms: float = 0.0  # engine prefill calls plus their first-token sampling
    prefill_wait_ms: float = 0.0  # queued prefills waiting for the loop (steps, prefills)
    prefill_chunks: int = 0  # prompt pieces written by chunked prefill calls
    #: Steps by kind, with bounded percentiles of their times and the gaps between them.
    kinds: StepKindStats = field(default_factory=StepKindStats)

    def observe_step(self, sessions: int, tokens: int, *, kind: StepKind, engine_ms: float,
                     sampler_ms: float, overhead_ms: float, device_ms: float | None,
                     gap_ms: float | None) -> None:
        """Count one step of ``kind`` and its time: the engine call, the sampler call, the
        loop's own work around them, the device's time when it was read (None: not
        timed), and the time since the previous step completed (None: none just before)."""
        self.kinds.observe(kind, wall_ms=engine_ms + sampler_ms + overhead_ms,
                           device_ms=device_ms, gap_ms=gap_ms, sessions=sessions)
        self.steps += 1
        self.step_tokens += tokens
        self.batch_sizes[sessions] += 1
        self.engine_ms += engine_ms
        self.sampler_ms += sampler_ms
        self.overhead_ms += overhead_ms
        if device_ms is not None:
            self.engine_device_ms += device_ms
            self.device_timed_steps += 1


class StepObserver(Protocol):
    """Told of every batched step (``eventspec.cloud.metrics``); must be cheap and never raise."""

    def on_step(self, sessions: int, tokens: int, seconds: float, kind: StepKind) -> None: ...
