"""Requests that find KV memory taken wait for room, first come first served.

Why: refusing the request after the last slot at once (RESOURCE_EXHAUSTED) turned a
momentary peak into errors, although slots free up every few hundred ms as answers end
(``bench_capacity.py --concurrency 64`` on an 80 GB card ended in that error). Now such
a request waits in a bounded FIFO until its KV fits (a free slot, or with KV by length
a free run of its own positions: ``eventspec.cloud.scheduling.kv_arena``), for at most
``--kv-wait-s`` or
the request's own deadline, whichever is sooner. RESOURCE_EXHAUSTED comes only when the
queue is full or the wait ran out, and the message says which.

Waiting happens on the event loop; slots are given back on the engine thread, which
wakes the queue through ``call_soon_threadsafe`` (:meth:`KvWaitQueue.wake_from_thread`).
A waiter that is cancelled (its caller hung up) leaves the queue and wakes the next.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import TypeVar

from eventspec.shared.contract.errors import ResourceExhausted

T = TypeVar("T")


class KvWaitQueue:
    """A FIFO of at most ``capacity`` requests waiting for KV room.

    ``fits(positions)``: whether a request needing that many positions would get KV
    now (the pool's ``fits``). The head of the line waits until it fits, so a long
    request is not passed by shorter ones forever."""

    def __init__(self, capacity: int, fits: Callable[[int], bool]) -> None:
        self.capacity = capacity
        self._fits = fits
        self._waiters: collections.deque[object] = collections.deque()
        self._changed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakers: set[asyncio.Task[None]] = set()  # referenced until they ran
        #: Requests that waited and got a slot, and those whose wait ran out.
        self.admitted_after_wait = 0
        self.timed_out = 0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
            self._loop = asyncio.get_running_loop()
        return self._changed

    async def admit(self, take_slot: Callable[[], T], *, positions: int, wait_s: float,
                    full_message: Callable[[], str]) -> T:
        """``take_slot()`` now if ``positions`` fit and nobody waits ahead; otherwise wait
        in line up to ``wait_s`` seconds. ``full_message()`` says what is full."""
        if not self._waiters and self._fits(positions):
            return take_slot()
        if self.capacity <= 0:
            return take_slot()  # no queue: the pool's own refusal
        if len(self._waiters) >= self.capacity:
            raise ResourceExhausted(
                f"{full_message()}, and the queue of {self.capacity} requests waiting for "
                "KV is full (--kv-queue); retry later"
            )
        changed = self._condition()
        me = object()
        self._waiters.append(me)
        try:
            async with changed:
                try:
                    await asyncio.wait_for(
                        changed.wait_for(lambda: self._waiters[0] is me
                                         and self._fits(positions)),
                        timeout=max(0.0, wait_s))
                except TimeoutError:
                    self.timed_out += 1
                    raise ResourceExhausted(
                        f"{full_message()}; waited {wait_s:g} s in line for KV (the "
                        "shorter of --kv-wait-s and the request's deadline); retry later"
                    ) from None
                self.admitted_after_wait += 1
                return take_slot()
        finally:
            self._waiters.remove(me)
            self._notify_soon()

    def wake_from_thread(self) -> None:
        """KV was given back (engine thread): let the first waiter look again."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._notify_soon)

    def _notify_soon(self) -> None:
        if self._changed is not None and self._waiters:
            task = asyncio.ensure_future(self._notify(self._changed))
            self._wakers.add(task)
            task.add_done_callback(self._wakers.discard)

    @staticmethod
    async def _notify(changed: asyncio.Condition) -> None:
        async with changed:
            changed.notify_all()
