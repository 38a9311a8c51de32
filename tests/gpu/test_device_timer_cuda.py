"""``DeviceTimer`` on CUDA (``make test-gpu``): it measures the queued work, which the
host's clock around the launch does not."""

from __future__ import annotations

import time

import pytest
import torch

from eventspec.cloud.scheduling.device_timer import DeviceTimer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _timed(cycles: int) -> tuple[float, float]:
    """(device ms, host ms around the launch) of a kernel spinning ``cycles`` cycles."""
    timer = DeviceTimer(torch.device("cuda"))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    timer.start()
    torch.cuda._sleep(cycles)
    timer.stop()
    host_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    device_ms = timer.elapsed_ms()
    assert device_ms is not None
    return device_ms, host_ms


def test_the_timer_sees_the_device_work_the_host_clock_misses() -> None:
    _timed(1_000_000)  # the first launch pays for lazy set-up (8.6 ms on an H200), untimed
    short, _ = _timed(1_000_000)
    long, host = _timed(50_000_000)  # some 25 ms at ~2 GHz
    assert long > 10 * short > 0
    assert host < long / 2  # the launch returned long before the work ended
