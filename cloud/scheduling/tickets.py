"""What crosses between a Generate stream (event loop) and the engine thread.

A request that ``Scheduler.admit`` lets in holds a KV slot from the :class:`SlotPool`
and is carried by its :class:`Ticket`; results come back as :data:`SchedulerEvent`
items on the ticket's queue, an iteration's worth at a time through the
:class:`Outbox`. Kept apart from ``eventspec.cloud.scheduling.scheduler`` because
these are the only objects both threads touch, so their rules (who writes what, when
the stream may read the session) are stated in one place.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from eventspec.cloud.speculation.decoding import Committed, DecodingSession
from eventspec.shared.contract.errors import EventSpecError, InvalidInput, ResourceExhausted
from eventspec.shared.contract.types import DraftTail

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Failure:
    """The request failed; the stream raises ``error``."""

    error: EventSpecError


SchedulerEvent = Committed | Failure


@dataclass(eq=False)
class Ticket:
    """One admitted request, shared by its stream (event loop) and the engine thread.

    The stream writes only ``mailbox`` (appends to a deque, which the engine thread pops:
    both atomic) and ``cancel_requested`` (a single attribute store, atomic under the
    GIL); the engine thread owns ``session`` until it posts a result with a finish
    reason, after which the stream may read it.
    """

    request_id: str
    session: DecodingSession
    events: asyncio.Queue[SchedulerEvent]
    generator: torch.Generator | None
    #: Drafts received and not yet read by the engine thread, oldest first (a tree's
    #: messages each carry new nodes only, so none may be skipped).
    mailbox: collections.deque[DraftTail] = field(default_factory=collections.deque)
    cancel_requested: bool = False
    slot_held: bool = True
    submitted_at: float = 0.0  # the scheduler's clock when the prefill was queued
    prefill_started_at: float = 0.0  # the scheduler's clock when its prefill call began

    @property
    def slot(self) -> int:
        return self.session.slot


class SlotPool:
    """Which KV slots are free. Taken on the event loop, given back on the engine thread."""

    def __init__(self, num_slots: int, max_seq_len: int) -> None:
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self._free = collections.deque(range(num_slots))
        self._lock = threading.Lock()
        #: Called (on the releasing thread) after a slot is given back: wakes the
        #: requests waiting for one (``eventspec.cloud.requests.kv_queue``).
        self.on_release: Callable[[], None] | None = None

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def positions_total(self) -> int:
        return self.num_slots * self.max_seq_len

    @property
    def positions_used(self) -> int:
        """Positions held: a held slot holds all of its own, used or not."""
        return (self.num_slots - len(self._free)) * self.max_seq_len

    @property
    def full_message(self) -> str:
        return (f"all {self.num_slots} KV slots are in use ({self.num_slots} slots x "
                f"{self.max_seq_len} tokens, GetServerInfo.limits.kv_slots)")

    def fits(self, positions: int) -> bool:
        """Whether a request of ``positions`` would be admitted now (a slot is free)."""
        return bool(self._free) and positions <= self.max_seq_len

    def acquire(self, positions: int | None = None) -> int:
        """A free slot (every slot holds ``max_seq_len`` positions, whatever ``positions``
        the request needs, at most that)."""
        if positions is not None and not 0 < positions <= self.max_seq_len:
            raise InvalidInput(f"a request of {positions} positions exceeds this verifier's "
                               f"{self.max_seq_len} per slot")
        with self._lock:
            if not self._free:
                raise ResourceExhausted(f"{self.full_message}; retry later or raise --kv-cache-gb")
            return self._free.popleft()

    def release(self, slot: int) -> None:
        with self._lock:
            if slot in self._free:
                raise RuntimeError(f"KV slot {slot} released twice")
            self._free.append(slot)
        if self.on_release is not None:
            self.on_release()


class Outbox:
    """One engine-loop iteration's results, handed to the event loop in one wake-up."""

    def __init__(self) -> None:
        self._items: list[tuple[Ticket, SchedulerEvent]] = []

    def post(self, ticket: Ticket, event: SchedulerEvent) -> None:
        self._items.append((ticket, event))

    def drain(self) -> list[tuple[Ticket, SchedulerEvent]]:
        """What was posted, oldest first, taken out (the outbox is left empty)."""
        items, self._items = self._items, []
        return items

    def flush(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Deliver what was posted to the tickets' queues on ``loop`` in one
        ``call_soon_threadsafe`` (dropped when no loop listens any more)."""
        items = self.drain()
        if not items or loop is None:
            return
        try:
            loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            log.debug("dropped %d results: the event loop is closed", len(items))


def _deliver(items: list[tuple[Ticket, SchedulerEvent]]) -> None:
    for ticket, event in items:
        ticket.events.put_nowait(event)
