"""How long the device spent on one engine call, measured without waiting for it.

Why: on CUDA an engine step returns as soon as its work is queued (a graph replay takes
microseconds of host time), and the sampler's read of the tokens is where the host
waits. So the host time around ``engine.step`` is launch time, not the engine's time,
and "in-server step over engine step" read 9-13 on an H200 for that reason alone
(``benchmarks/results/load-h200-chunk512.json``). CUDA events recorded around the call
on the engine's stream give its device time; they are read after the sampler's read,
which has already waited for that work, so reading them never adds a synchronisation.
On CPU the work is done when the call returns, and host time is the device time.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class DeviceTimer:
    """``start()`` before the call, ``stop()`` after it, ``elapsed_ms()`` once the work
    is known finished (None if it is not yet: never blocks)."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._device = device
        # CUDA: one pair of events, re-recorded every step (no allocation on the loop).
        self._begin: Any = None
        self._end: Any = None
        self._marked = False
        if self._cuda:
            self._begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self._t0 = 0.0
        self._t1 = 0.0

    def start(self) -> None:
        self._marked = False
        if self._cuda:
            self._begin.record(torch.cuda.current_stream(self._device))
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self._cuda:
            self._end.record(torch.cuda.current_stream(self._device))
        else:
            self._t1 = time.perf_counter()
        self._marked = True

    def elapsed_ms(self) -> float | None:
        """The device time between the marks; None if unmarked or not yet finished."""
        if not self._marked:
            return None
        if not self._cuda:
            return (self._t1 - self._t0) * 1e3
        if not self._end.query():
            return None
        return float(self._begin.elapsed_time(self._end))
