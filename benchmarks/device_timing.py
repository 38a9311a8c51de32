"""Wall-clock timing of device work for the benchmarks: a device sync on each side of
every call, so a GPU call is timed to its end and not to its launch."""

from __future__ import annotations

import math
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


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device-to-device copy, counting bytes read plus written."""
    if device.type != "cuda":
        return float("nan")
    n = 2**30  # 1 GiB bf16 elements x 2 bytes = 2 GiB each way
    src = torch.randn(n // 2, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), repeats=10)
    return 2 * (n / 2) * 2 / (ms / 1e3)


def floor_text(value: float | None) -> str:
    """A floor in a table: two decimals, or "-" where none was measured."""
    return "-" if value is None else f"{value:.2f}"


def bandwidth_floor_ms(bytes_moved: int, bandwidth: float) -> float | None:
    """The least time ``bytes_moved`` take at ``bandwidth`` bytes/s (the card's measured
    copy rate, :func:`copy_bandwidth`), in ms; None where no bandwidth was measured (NaN
    on a CPU, or not positive): a floor from a nominal rate once printed 14.32 ms over
    a 6.67 ms step (issue 35)."""
    if not bandwidth > 0 or math.isnan(bandwidth):
        return None
    return bytes_moved / bandwidth * 1e3
