"""The prefills waiting for the engine loop, and which of them go into one prefill call.

First come, first served: a call takes the oldest waiting request, whatever its length,
plus those after it while their prompts fit ``token_budget`` tokens in all; a request
that ended while it waited (released, cancelled, overdue) is dropped as it comes up.
Kept apart from the loop (``eventspec.cloud.scheduler``), which asks only for the next
group, so the admission policy reads in one place. Only the engine thread changes the
queue; its length is read from other threads (approximate) for the metrics.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.tickets import Ticket

#: Prompt tokens one prefill call may take when several requests wait. One 2,103-token
#: Video-LLaVA prompt already exceeds it, so on a GPU prefills stay one per call (each
#: fills the device; grouping two would double the stall of running sessions for little
#: gain); the toy's ~150-token prompts go up to 13 per call, so requests that arrive
#: together start together and step in full batches. The oldest waiting request is
#: always taken, whatever its length.
DEFAULT_PREFILL_TOKEN_BUDGET = 2048


class PrefillQueue:
    """Queued prefills, oldest first, and the token budget of one call."""

    def __init__(self, token_budget: int = DEFAULT_PREFILL_TOKEN_BUDGET) -> None:
        if token_budget < 1:
            raise ValueError(f"prefill_token_budget must be >= 1, got {token_budget}")
        self.token_budget = token_budget
        self._waiting: collections.deque[tuple[Ticket, PrefillRequest]] = collections.deque()

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, ticket: Ticket, request: PrefillRequest) -> None:
        """Queue ``ticket``'s prefill behind the others."""
        self._waiting.append((ticket, request))

    def tickets(self) -> list[Ticket]:
        """The waiting requests' tickets, oldest first (a copy)."""
        return [t for t, _ in self._waiting]

    def clear(self) -> None:
        self._waiting.clear()

    def forget(self, ticket: Ticket) -> None:
        """Drop ``ticket``'s prefill if it is still waiting."""
        if any(t is ticket for t, _ in self._waiting):
            self._waiting = collections.deque((t, r) for t, r in self._waiting if t is not ticket)

    def next_group(
        self, still_wanted: Callable[[Ticket], bool]
    ) -> list[tuple[Ticket, PrefillRequest]]:
        """Take the next call's requests off the queue (empty when none waits).

        Each request leaves the queue before ``still_wanted`` is asked about it, since the
        answer may end it (and the loop then ``forget``s it here); one not wanted takes no
        room in the budget.
        """
        group: list[tuple[Ticket, PrefillRequest]] = []
        tokens = 0
        while self._waiting:
            ticket, req = self._waiting[0]
            if group and tokens + len(req.input_ids) > self.token_budget:
                break
            self._waiting.popleft()
            if not still_wanted(ticket):
                continue
            group.append((ticket, req))
            tokens += len(req.input_ids)
        return group
