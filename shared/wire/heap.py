"""Give memory that refused (or any) calls freed back to the system.

Why: a request's bytes are allocated with ``malloc``, by gRPC's threads and by Python. When
the call ends they are freed, but glibc keeps freed memory in its heaps for reuse and
returns it to the system only when the top of a heap is free: after 600 refused 4 MiB
calls a node stayed hundreds of MB larger for good, idle or not (issue 38, red-team
finding 1). ``malloc_trim(0)`` returns every free page of every heap.

``HeapTrimmer`` looks every ``TRIM_PERIOD_S``. It trims when the process has faulted in
``TRIM_BYTES`` of new pages since its last trim (minor page faults: memory touched
afresh, whoever allocated it) and glibc holds at least as much free (``mallinfo2``'s
``fordblks``). A process that reuses the memory it has faults in nothing and is never
trimmed; a burst of requests is, once or twice while it lasts and once after. Both
looks and the trim run in a worker thread (``malloc_trim`` takes each heap's lock in
turn, for up to tens of milliseconds on a large fragmented heap), leaving the event loop
free. A node that is not on glibc 2.33 or later (musl, macOS) has no ``mallinfo2`` and
the trimmer does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import resource
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Seconds between two looks.
TRIM_PERIOD_S = 1.0
#: Memory faulted in since the last trim, and free in glibc's heaps, that makes a trim.
TRIM_BYTES = 32 << 20
_PAGE = resource.getpagesize()


def faulted_bytes() -> int:
    """Bytes of pages this process has faulted in so far (minor faults, all threads)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt * _PAGE


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later)."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


class Glibc:
    """``malloc_trim`` and the free bytes glibc holds; ``None`` from ``load`` elsewhere."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._mallinfo2 = libc.mallinfo2
        self._mallinfo2.restype = _MallInfo2
        self._mallinfo2.argtypes = []
        self._trim = libc.malloc_trim
        self._trim.restype = ctypes.c_int
        self._trim.argtypes = [ctypes.c_size_t]

    @classmethod
    def load(cls) -> Glibc | None:
        try:
            return cls(ctypes.CDLL(None))
        except (OSError, AttributeError):  # not glibc, or older than 2.33
            return None

    def free_bytes(self) -> int:
        """Bytes free in glibc's heaps, returned to the system or not."""
        return int(self._mallinfo2().fordblks)

    def trim(self) -> bool:
        """Return free pages to the system; True if any were."""
        return bool(self._trim(0))


class HeapTrimmer:
    """Trim glibc's heaps after ``min_bytes`` were faulted in and are free, looking every
    ``period_s``; ``trims`` counts the trims done."""

    def __init__(self, period_s: float = TRIM_PERIOD_S, min_bytes: int = TRIM_BYTES,
                 glibc: Callable[[], Glibc | None] = Glibc.load,
                 faulted: Callable[[], int] = faulted_bytes) -> None:
        self.period_s = period_s
        self.min_bytes = min_bytes
        self.glibc = glibc()
        self.faulted = faulted
        self.trims = 0
        self._since = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.glibc is not None and self._task is None:
            self._since = self.faulted()
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name="heap-trimmer")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _trim_if_free(self) -> bool:
        assert self.glibc is not None
        free = self.glibc.free_bytes()
        if free < self.min_bytes:
            return False
        self.glibc.trim()
        self._since = self.faulted()
        self.trims += 1
        log.debug("heap trimmed: %d MB were free", free >> 20)
        return True

    async def check(self) -> bool:
        """Trim if ``min_bytes`` were faulted in since the last trim (or the start) and
        glibc holds as much free; True if it trimmed."""
        if self.glibc is None or self.faulted() - self._since < self.min_bytes:
            return False
        return await asyncio.to_thread(self._trim_if_free)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            await self.check()
