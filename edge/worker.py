"""Runs model work off the asyncio loop, in one worker that owns the device (both nodes).

Sessions submit their next unit of work (a prefill or a step); the worker runs them
one at a time in FIFO order, so every ready session gets a turn and none starves. The
single queue is also the place to add batching later: a scheduler that drains several
ready steps and verifies them in one batched forward.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")
log = logging.getLogger(__name__)


class ModelWorker:
    """One thread that owns the model; ``run`` awaits a callable executed there."""

    def __init__(self, name: str = "model-worker") -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._queued = 0
        self.busy_s = 0.0
        self.jobs = 0

    @property
    def queued(self) -> int:
        """Jobs submitted and not yet finished."""
        return self._queued

    async def run(self, fn: Callable[[], R]) -> R:
        """Run ``fn`` on the worker thread and return its result on the event loop."""
        loop = asyncio.get_running_loop()
        self._queued += 1

        def timed() -> R:
            t0 = time.perf_counter()
            try:
                return fn()
            finally:
                self.busy_s += time.perf_counter() - t0
                self.jobs += 1

        try:
            return await loop.run_in_executor(self._pool, timed)
        finally:
            self._queued -= 1

    def shutdown(self) -> None:
        """Stop accepting work; running work finishes."""
        self._pool.shutdown(wait=False, cancel_futures=True)
