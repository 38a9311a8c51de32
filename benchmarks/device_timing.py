"""Wall-clock timing of device work for the benchmarks: a device sync on each side of
every call, so a GPU call is timed to its end and not to its launch."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def times_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> list[float]:
    """``repeats`` timings of ``fn`` in ms, sorted, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """The median of :func:`times_ms`."""
    return statistics.median(times_ms(fn, repeats, warmup))


def median_p10_ms(fn: Callable[[], object], repeats: int, warmup: int = 3
                  ) -> tuple[float, float]:
    """(median, p10) of :func:`times_ms`."""
    times = times_ms(fn, repeats, warmup)
    return statistics.median(times), times[len(times) // 10]
