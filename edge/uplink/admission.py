"""The edge's admission to its cloud: as many Asks in flight as the cloud will take from
it, the rest waiting in a bounded first-in, first-out queue.

The cloud refuses a session beyond its caps with RESOURCE_EXHAUSTED (its KV slots, and
the sessions one authenticated caller may hold). An edge that sent every Ask on got 90%
of them refused under 50 clients, each after rendering frames and features for nothing.
So the edge keeps to the caps the cloud advertises in GetServerInfo: an Ask takes a slot
before any model work, and waits for one, in order, until its deadline, seeing its
place in the queue. Only a full queue refuses at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator

from eventspec.shared.contract.errors import DeadlineExceeded, ResourceExhausted
from eventspec.shared.contract.types import ServerLimits


def cloud_slots(limits: ServerLimits) -> int:
    """How many sessions this edge may hold on the cloud at once: the smallest of the
    advertised caps (0 means "not reported" and does not count)."""
    caps = [c for c in (limits.max_sessions, limits.kv_slots,
                        limits.max_sessions_per_principal) if c > 0]
    return max(1, min(caps, default=1))


class AdmissionQueue:
    """Slots for Asks in flight to the cloud, and the Asks waiting for one."""

    def __init__(self, *, max_waiting: int, capacity: int = 1) -> None:
        if max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        self.max_waiting = max_waiting
        self.capacity = max(1, capacity)
        self.in_flight = 0
        self._waiting: deque[asyncio.Event] = deque()
        self._changed = asyncio.Event()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def set_capacity(self, capacity: int) -> None:
        """Follow the cloud's advertised caps (a larger cap admits waiters at once; a
        smaller one lets the Asks in flight finish)."""
        self.capacity = max(1, capacity)
        self._admit()

    def release(self) -> None:
        """An admitted Ask is over, however it ended: its slot goes to the next waiter."""
        self.in_flight -= 1
        self._admit()

    async def enter(self, timeout_s: float) -> AsyncIterator[int]:
        """Take a slot, waiting at most ``timeout_s``; yields this Ask's place in the
        queue (1 = next) whenever it changes. Returns once admitted: the caller must then
        ``release()``. Raises ResourceExhausted when the queue is full and
        DeadlineExceeded when the wait runs out; an abandoned wait leaves the queue."""
        if not self._waiting and self.in_flight < self.capacity:
            self.in_flight += 1
            return
        if len(self._waiting) >= self.max_waiting:
            raise ResourceExhausted(
                f"the edge's queue for the cloud verifier is full ({len(self._waiting)} Asks "
                f"waiting, {self.in_flight} in flight); try again later"
            )
        ticket = asyncio.Event()
        self._waiting.append(ticket)
        started = time.monotonic()
        try:
            shown = 0
            while not ticket.is_set():
                place = self._waiting.index(ticket) + 1
                if place != shown:
                    shown = place
                    yield place
                if ticket.is_set():
                    break
                left = timeout_s - (time.monotonic() - started)
                if left <= 0:
                    raise DeadlineExceeded(
                        f"waited {timeout_s:.1f} s in the edge's queue for the cloud verifier "
                        f"(place {place}, {self.in_flight} in flight); try again later"
                    )
                changed = self._changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=left)
        except BaseException:
            if ticket.is_set():
                self.release()  # admitted just as the caller went away
            else:
                self._waiting.remove(ticket)
                self._notify()
            raise

    def _admit(self) -> None:
        while self._waiting and self.in_flight < self.capacity:
            self._waiting.popleft().set()
            self.in_flight += 1
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
