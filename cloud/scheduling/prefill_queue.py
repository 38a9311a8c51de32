"""The prefills waiting for the engine loop, and which of them go into one prefill call.

First come, first served: a call takes the oldest waiting request, whatever its length,
plus those after it while their prompts fit ``token_budget`` tokens in all; a request
that ended while it waited (released, cancelled, overdue) is dropped as it comes up.
With chunked prefill (``eventspec.cloud.scheduling.prefill_chunking``) a call takes pieces
instead: a reused prefix's few remaining rows first (its question), then the rest of
the oldest prompt, then the next prompts' beginnings, until the chunk budget is
spent; a prompt left unfinished stays at the head with its progress.
Kept apart from the scheduler (``eventspec.cloud.scheduling.step_scheduler``), which asks only for
the next group, so the admission policy reads in one place. Only the engine thread changes the
queue; its length is read from other threads (approximate) for the metrics.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

import torch

from eventspec.cloud.engine.ahead import AheadEmbeds
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.scheduling.piece_slack import Waiting
from eventspec.cloud.scheduling.tickets import Ticket
from eventspec.shared.node.static.buckets import MAX_PIECES

#: Prompt tokens one prefill call may take when several requests wait. One 2,103-token
#: Video-LLaVA prompt already exceeds it, so on a GPU prefills stay one per call (each
#: fills the device; grouping two would double the stall of running sessions for little
#: gain); the toy's ~150-token prompts go up to 13 per call, so requests that arrive
#: together start together and step in full batches. The oldest waiting request is
#: always taken, whatever its length.
DEFAULT_PREFILL_TOKEN_BUDGET = 2048
#: A prompt whose prefix came from the cache and has at most this many rows left (its
#: question) goes first in a chunked call, outside the call's budget, and so finishes
#: in it: a repeated clip's question does not wait behind
#: a long prompt's chunks (on the H200 its TTFT was 63-69 ms at 4-8 requests/s, the
#: queue behind 512-token chunks a large part of it). At most
#: :data:`SHORT_TAILS_PER_CALL` such rows ride in one call, so the call barely grows
#: (a piece's cost on a GPU is mostly per call, not per row).
SHORT_TAIL_TOKENS = 64
SHORT_TAILS_PER_CALL = 256
#: Prompts whose embeddings may be in the making on the side stream at once. Each holds
#: its [L, H] embeddings (17 MB for a 2,103-token Video-LLaVA prompt) until its first
#: piece; two cover a burst of arrivals within one step at the loads measured.
AHEAD_PROMPTS = 2
#: Towers started after one step's launch: a tower beside a step slows it by about the
#: tower's time (both fill the GPU; 5 ms on an H100), so two at once would double one
#: step's slowdown where one a step spreads it; at 85 steps a second the loop still
#: starts far more towers than the 8-12 prompts a second measured arrive.
TOWERS_PER_STEP = 1


@dataclass(eq=False)
class Pending:
    """A queued prefill and how far its chunks have come."""

    ticket: Ticket
    request: PrefillRequest
    done: int = 0  # prompt positions already in the slot
    embeds: torch.Tensor | None = None  # [L - first, H] once its first chunk was planned
    first: int = 0  # the prompt row ``embeds`` starts at (a reused prefix's length)
    started: bool = False  # a piece of it has been written
    prefix_key: str | None = None  # save its prefix under this key once it is written
    prefix_len: int = 0
    reused: int = 0  # prompt positions copied from the prefix cache (a hit)
    #: Its embeddings enqueued on the engine's side stream before its first piece
    #: (``PrefillCalls.embed_ahead``); ``chunks_of`` takes them into ``embeds``.
    ahead: AheadEmbeds | None = None

    @property
    def length(self) -> int:
        return len(self.request.input_ids)

    @property
    def tower_due(self) -> bool:
        """Its next piece runs the video tower: its embeddings are not made yet, nor
        being made ahead (``PrefillCalls.chunks_of`` makes them at its first piece), it
        has pixels to encode, and no reused prefix holds its video rows."""
        return (self.embeds is None and self.ahead is None and self.reused == 0
                and self.request.pixel_values_videos is not None)

    @property
    def tower_running(self) -> bool:
        """Its embeddings are being made on the side stream and are not done yet."""
        return self.ahead is not None and not self.ahead.ready

    def short_tail(self, room: int) -> bool:
        """A reused prefix's rest of at most ``min(SHORT_TAIL_TOKENS, room)`` rows,
        untouched yet: it rides first, whole, outside the call's budget."""
        rest = self.length - self.done
        untouched_reuse = self.reused > 0 and self.done == self.reused
        return untouched_reuse and rest <= min(SHORT_TAIL_TOKENS, room)


@dataclass(frozen=True)
class Piece:
    """Positions ``start`` .. ``end - 1`` of ``pending``'s prompt, for one call;
    ``tower``: the call runs its prompt's video tower (``Pending.tower_due`` when it
    was planned), which ``--prefill-chunk slack`` prices."""

    pending: Pending
    start: int
    end: int
    tower: bool = False

    @property
    def finishes(self) -> bool:
        return self.end == self.pending.length


class PrefillQueue:
    """Queued prefills, oldest first, and the token budget of one call."""

    def __init__(self, token_budget: int = DEFAULT_PREFILL_TOKEN_BUDGET) -> None:
        if token_budget < 1:
            raise ValueError(f"prefill_token_budget must be >= 1, got {token_budget}")
        self.token_budget = token_budget
        self._waiting: collections.deque[Pending] = collections.deque()

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, ticket: Ticket, request: PrefillRequest) -> Pending:
        """Queue ``ticket``'s prefill behind the others."""
        pending = Pending(ticket, request)
        self._waiting.append(pending)
        return pending

    def peek(self) -> Pending | None:
        """The oldest waiting prefill, left in the queue."""
        return self._waiting[0] if self._waiting else None

    def tickets(self) -> list[Ticket]:
        """The waiting requests' tickets, oldest first (a copy)."""
        return [p.ticket for p in self._waiting]

    def clear(self) -> None:
        self._waiting.clear()

    def forget(self, ticket: Ticket) -> None:
        """Drop ``ticket``'s prefill if it is still waiting."""
        if any(p.ticket is ticket for p in self._waiting):
            self._waiting = collections.deque(p for p in self._waiting if p.ticket is not ticket)

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
            head = self._waiting[0]
            if group and tokens + head.length > self.token_budget:
                break
            self._waiting.popleft()
            if not still_wanted(head.ticket):
                continue
            group.append((head.ticket, head.request))
            tokens += head.length
        return group

    def next_pieces(self, budget: int, still_wanted: Callable[[Ticket], bool], *,
                    wait_for_towers: bool = False) -> list[Piece]:
        """The next chunked call: first the short tails (prompts whose prefix came from
        the cache, with at most :data:`SHORT_TAIL_TOKENS` rows left, oldest first, up to
        :data:`SHORT_TAILS_PER_CALL` rows outside the budget), then pieces of the oldest
        prompts, ``budget`` tokens in all (at least one token of the oldest). A prompt
        whose piece reaches its end leaves the queue; one cut short stays at the head,
        and its ``done`` moves on only when the caller records the call
        (:meth:`advance`). Unwanted requests are dropped as they come up, as in
        :meth:`next_group`. ``wait_for_towers`` (towers are made ahead, beside the
        steps): the pieces stop at the first prompt whose tower has not started or still
        runs (``Pending.tower_due``, ``Pending.tower_running``), so no step waits for
        it; none overtakes it."""
        pieces: list[Piece] = []
        taken: set[Pending] = set()
        room = SHORT_TAILS_PER_CALL
        for pending in list(self._waiting):
            if not pending.short_tail(room):
                continue
            if not still_wanted(pending.ticket):
                self.forget(pending.ticket)
                continue
            pieces.append(Piece(pending, pending.done, pending.length))
            taken.add(pending)
            room -= pending.length - pending.done
        left = max(1, budget)
        i = 0
        while i < len(self._waiting) and left > 0:
            pending = self._waiting[i]
            if pending in taken:
                i += 1
                continue
            if not still_wanted(pending.ticket):
                self.forget(pending.ticket)
                continue
            if wait_for_towers and (pending.tower_due or pending.tower_running):
                break
            end = min(pending.length, pending.done + left)
            pieces.append(Piece(pending, pending.done, end, pending.tower_due))
            left -= end - pending.done
            i += 1
        for piece in pieces:
            if piece.finishes:
                self._waiting.remove(piece.pending)
        return pieces

    def outlook(self, now: float | None = None, *,
                towers_in_step: bool = True) -> list[Waiting]:
        """The waiting prompts as ``--prefill-chunk slack`` sizes a call over them
        (:func:`~eventspec.cloud.scheduling.piece_slack.split`), oldest first: the rows
        each has left, whether its next piece runs the tower (never, when towers run
        ahead: not ``towers_in_step``), whether it is a short tail (as
        :meth:`next_pieces` takes them), and the ms since its request was submitted at
        clock time ``now`` (0 without it); every tail, and the first :data:`MAX_PIECES`
        others (a call holds no more)."""
        out, room, others = [], SHORT_TAILS_PER_CALL, 0
        for pending in self._waiting:
            rest = pending.length - pending.done
            tail = pending.short_tail(room)
            if tail:
                room -= rest
            elif others == MAX_PIECES:
                continue
            else:
                others += 1
            waited = 0.0 if now is None else max(0.0, now - pending.ticket.submitted_at) * 1e3
            out.append(Waiting(rest, towers_in_step and pending.tower_due, tail, waited))
        return out

    def towers_to_start(self, limit: int) -> list[Pending]:
        """The waiting prompts, oldest first, whose tower has not started
        (``Pending.tower_due``): the ones to embed ahead after this step's launch, at
        most :data:`TOWERS_PER_STEP`, and as many as keep ``limit`` prompts' embeddings
        made ahead and not yet taken."""
        room = min(TOWERS_PER_STEP, limit - sum(p.ahead is not None for p in self._waiting))
        return [p for p in self._waiting if p.tower_due][:max(0, room)]

    @staticmethod
    def advance(pieces: list[Piece]) -> None:
        """Record that the pieces' call wrote them."""
        for piece in pieces:
            piece.pending.done = piece.end
