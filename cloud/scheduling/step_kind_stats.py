"""The engine loop's steps by kind (``eventspec.cloud.scheduling.step_kinds``): how many,
how long, and the gaps between them, in bounded histograms.

Per kind, three :class:`~eventspec.cloud.scheduling.log_histogram.LogHistogram`\\ s:

- ``wall``: the step's host time, from planning to the loop's commits (engine call,
  sampler, the loop's own work: what ``SchedulerStats`` splits into three sums), one
  observation per step;
- ``device``: the device's time on its engine call (``DeviceTimer``; a mixed step's
  includes the tower it runs), one per step whose time was read;
- ``gap``: the time from the previous step's completion (its sampler's return) to this
  one's, one observation per session in this step, so its percentiles are over what the
  sessions saw, as the client's inter-token latency is (target-only: one token a
  session a step); none after an iteration that ran no step (nothing decoded across
  it) or whose step failed. The gap is attributed to the kind of the step that ends it,
  and holds everything the loop did in between: a prefill call of its own, the prefix
  cache's copies, a failed mixed step.

Why these and not the sums alone: the inter-token p99 was the same under two piece
policies (issue 39), and only a breakdown by kind can say which steps make it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eventspec.cloud.scheduling.log_histogram import LogHistogram, bucket_low
from eventspec.cloud.scheduling.step_kinds import StepKind

#: The percentiles a summary reports.
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


@dataclass
class KindTimes:
    """One kind's histograms."""

    wall: LogHistogram = field(default_factory=LogHistogram)
    device: LogHistogram = field(default_factory=LogHistogram)
    gap: LogHistogram = field(default_factory=LogHistogram)

    def copy(self) -> KindTimes:
        return KindTimes(self.wall.copy(), self.device.copy(), self.gap.copy())

    def minus(self, before: KindTimes) -> KindTimes:
        return KindTimes(self.wall.minus(before.wall), self.device.minus(before.device),
                         self.gap.minus(before.gap))


class StepKindStats:
    """Every kind's histograms, all made up front (the set is fixed, so a reader never
    sees the dict change)."""

    def __init__(self, by_kind: dict[StepKind, KindTimes] | None = None) -> None:
        self.by_kind = by_kind if by_kind is not None else {k: KindTimes() for k in StepKind}

    def observe(self, kind: StepKind, *, wall_ms: float, device_ms: float | None,
                gap_ms: float | None, sessions: int) -> None:
        """One step of ``kind`` (engine thread); ``device_ms`` None: not read; ``gap_ms``
        None: no step completed just before it."""
        times = self.by_kind[kind]
        times.wall.observe(wall_ms)
        if device_ms is not None:
            times.device.observe(device_ms)
        if gap_ms is not None:
            times.gap.observe(gap_ms, weight=sessions)

    def steps(self, kind: StepKind) -> int:
        return self.by_kind[kind].wall.count

    def copy(self) -> StepKindStats:
        """A snapshot (from any thread)."""
        return StepKindStats({k: t.copy() for k, t in self.by_kind.items()})

    def since(self, before: StepKindStats) -> StepKindStats:
        """What was recorded after ``before`` (an earlier :meth:`copy`)."""
        return StepKindStats({k: t.minus(before.by_kind[k]) for k, t in self.by_kind.items()})

    def summary(self) -> dict[str, Any]:
        """JSON-ready: the gaps of all kinds together (``gap_ms``), the time from which a
        gap is in the tail (``tail_from_ms``: the lower bound of the all-kinds p99's
        bucket), and per kind that ran (``kinds``, in the rule's order) its steps, wall,
        device and gap percentiles, and how many of its session gaps are in the tail
        (``gaps_in_tail``: which kinds make the p99)."""
        gaps = LogHistogram()
        for t in self.by_kind.values():
            gaps = gaps.plus(t.gap)
        tail = gaps.quantile_bucket(0.99)
        kinds = {}
        for kind, t in self.by_kind.items():
            if not t.wall.count:
                continue
            kinds[str(kind)] = {
                "steps": t.wall.count, "wall_ms": spread(t.wall),
                "device_ms": spread(t.device), "gap_ms": spread(t.gap),
                "gaps_in_tail": t.gap.count_from(tail) if tail is not None else 0,
            }
        return {"gap_ms": spread(gaps),
                "tail_from_ms": bucket_low(tail) if tail is not None else None,
                "kinds": kinds}


def spread(h: LogHistogram) -> dict[str, Any]:
    """Observations, mean and :data:`QUANTILES` of ``h`` (None where it is empty)."""
    out: dict[str, Any] = {"n": h.count, "mean": h.mean()}
    out.update({name: h.quantile(q) for name, q in QUANTILES})
    return out
