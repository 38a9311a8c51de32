"""The bounded percentile recorder (``log_histogram``) and the per-kind breakdown built
on it (``step_kind_stats``): fixed memory, percentiles within half a bucket of the exact
ones, subtraction for a benchmark level's share, and a summary that says which kinds'
gaps make the tail."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspec.cloud.scheduling.log_histogram import (
    BUCKETS,
    HIGH_MS,
    LOW_MS,
    RATIO,
    LogHistogram,
    bucket_low,
    bucket_of,
)
from eventspec.cloud.scheduling.step_kind_stats import StepKindStats
from eventspec.cloud.scheduling.step_kinds import StepKind
from tests.support.tools import load_tool

times = st.floats(LOW_MS, HIGH_MS / 2, allow_nan=False, allow_infinity=False)


def _exact(values: list[float], q: float) -> float:
    """The nearest-rank quantile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@given(st.lists(times, min_size=1, max_size=300), st.sampled_from([0.5, 0.9, 0.99, 1.0]))
def test_a_percentile_is_within_half_a_bucket_of_the_exact_one(values: list[float],
                                                                q: float) -> None:
    h = LogHistogram()
    for v in values:
        h.observe(v)
    got, want = h.quantile(q), _exact(values, q)
    assert got is not None
    slack = math.sqrt(RATIO) * (1 + 1e-9)
    assert want / slack <= got <= want * slack
    assert h.count == len(values)
    assert h.mean() == pytest.approx(sum(values) / len(values))


@given(st.lists(times, max_size=100), st.lists(times, min_size=1, max_size=100))
def test_minus_an_earlier_copy_leaves_what_came_after(before: list[float],
                                                      after: list[float]) -> None:
    h, alone = LogHistogram(), LogHistogram()
    for v in before:
        h.observe(v)
    mark = h.copy()
    for v in after:
        h.observe(v)
        alone.observe(v)
    since = h.minus(mark)
    assert since.counts == alone.counts
    assert since.quantile(0.99) == alone.quantile(0.99)
    assert mark.count == len(before)  # the copy did not move


def test_memory_is_fixed_and_bad_times_are_not_counted() -> None:
    h = LogHistogram()
    rng = random.Random(0)
    for _ in range(20_000):
        h.observe(rng.lognormvariate(2.5, 1.0))
    for bad in (float("nan"), -1.0):
        h.observe(bad)
    h.observe(1e9)  # beyond the top: the last bucket
    h.observe(0.0)  # below the bottom: the first
    assert len(h.counts) == BUCKETS and h.count == 20_002
    assert h.counts[-1] == 1 and h.counts[0] >= 1
    h.observe(12.0, weight=5)
    assert h.count == 20_007
    assert bucket_low(bucket_of(12.0)) <= 12.0 < bucket_low(bucket_of(12.0) + 1)
    assert LogHistogram().quantile(0.5) is None and LogHistogram().mean() is None


def _steps(stats: StepKindStats, kind: StepKind, n: int, gap_ms: float, sessions: int = 4
           ) -> None:
    for _ in range(n):
        stats.observe(kind, wall_ms=gap_ms * 0.9, device_ms=gap_ms * 0.8, gap_ms=gap_ms,
                      sessions=sessions)


def test_the_summary_names_the_kinds_whose_gaps_make_the_tail() -> None:
    stats = StepKindStats()
    _steps(stats, StepKind.PLAIN, 990, 12.0)
    _steps(stats, StepKind.TOWER, 20, 29.0)
    stats.observe(StepKind.FINISHING, wall_ms=14.0, device_ms=None, gap_ms=None, sessions=4)
    s = stats.summary()
    assert list(s["kinds"]) == ["tower", "finishing", "plain"]  # the rule's order, ran only
    tower, plain, finishing = s["kinds"]["tower"], s["kinds"]["plain"], s["kinds"]["finishing"]
    assert tower["steps"] == 20 and plain["steps"] == 990
    assert tower["gap_ms"]["n"] == 80  # one gap per session of the step
    assert s["gap_ms"]["n"] == 4040
    assert tower["gap_ms"]["p50"] == pytest.approx(29.0, rel=0.03)
    assert plain["device_ms"]["p99"] == pytest.approx(9.6, rel=0.03)
    assert finishing["device_ms"]["n"] == 0 and finishing["device_ms"]["p50"] is None
    assert finishing["gap_ms"]["n"] == 0 and finishing["gaps_in_tail"] == 0
    # 2 % of the session gaps are the towers': the p99 is theirs, and all of them are in it.
    assert s["gap_ms"]["p99"] == pytest.approx(29.0, rel=0.03)
    assert s["tail_from_ms"] <= 29.0 and tower["gaps_in_tail"] == 80
    assert plain["gaps_in_tail"] == 0
    assert stats.steps(StepKind.PLAIN) == 990


def test_since_gives_one_level_of_a_benchmark() -> None:
    stats = StepKindStats()
    _steps(stats, StepKind.PLAIN, 50, 10.0)
    mark = stats.copy()
    _steps(stats, StepKind.PIECE, 5, 20.0)
    _steps(stats, StepKind.PLAIN, 7, 10.0)
    level = stats.since(mark).summary()
    assert {k: v["steps"] for k, v in level["kinds"].items()} == {"piece": 5, "plain": 7}
    assert StepKindStats().summary() == {"gap_ms": {"n": 0, "mean": None, "p50": None,
                                                    "p90": None, "p99": None},
                                         "tail_from_ms": None, "kinds": {}}


def test_the_results_table_renders_a_load_run_with_the_breakdown() -> None:
    stats = StepKindStats()
    _steps(stats, StepKind.PLAIN, 99, 12.0)
    _steps(stats, StepKind.TOWER, 1, 29.0)
    level = {"rate_per_s": 8.0, "step_kinds": stats.summary()}
    older = {"rate_per_s": 12.0}  # a run from before the breakdown: left out
    run = {"configs": [{"config": {"name": "slack"}, "levels": [level, older]}]}
    lines = load_tool("results_tables").KINDS["step-kinds"]([("load", run)])
    assert lines[0].startswith("| config | rate /s | step kind | steps | wall p50 / p99 ms |")
    assert len(lines) == 4
    assert lines[2].startswith("| slack | 8 | tower | 1 | ")
    assert lines[2].endswith(" | 4 of 400 |") and lines[3].startswith("| slack | 8 | plain | 99 |")
