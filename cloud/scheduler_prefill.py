"""The engine loop's prefill side: whole prompts in grouped calls, prompt pieces (chunked
prefill, a reused prefix's rest) in calls of their own or riding the step, and each
finished prompt's first token. A mixin of :class:`eventspec.cloud.scheduler.Scheduler`,
kept apart so that module holds the loop, admission and the step; the attributes it
uses are the scheduler's (declared below for the type checker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from eventspec.cloud.engine.base import (
    BatchedEngine,
    ChunkedPrefillEngine,
    PrefillChunk,
    PrefillRequest,
)
from eventspec.cloud.prefill_chunking import ChunkPolicy
from eventspec.cloud.prefill_queue import Piece, PrefillQueue
from eventspec.cloud.prefix_cache import PrefixCache, keep_prefix
from eventspec.cloud.sampler import BatchedSampler, SampleSpec
from eventspec.cloud.scheduler_stats import SchedulerStats
from eventspec.cloud.tickets import Failure, Outbox, SchedulerEvent, Ticket
from eventspec.shared.contract.errors import EventSpecError, Unavailable
from eventspec.shared.contract.timing import CloudCost

log = logging.getLogger("eventspec.cloud.scheduler")


class PrefillPhase:
    """Prefill calls of the engine loop (see the module docstring)."""

    engine: BatchedEngine
    sampler: BatchedSampler
    stats: SchedulerStats
    chunking: ChunkPolicy
    chunk_cost: CloudCost | None
    prefix_cache: PrefixCache | None
    mixed_steps: bool
    _prefills: PrefillQueue
    _running: list[Ticket]
    _last_step: tuple[int, int]
    _outbox: Outbox
    _clock: Callable[[], float]

    if TYPE_CHECKING:
        def _end(self, ticket: Ticket, event: SchedulerEvent) -> None: ...
        def _ended_early(self, ticket: Ticket) -> bool: ...
        def _read_mailbox(self, ticket: Ticket) -> None: ...
        def _spec(self, ticket: Ticket, rows: int, drafts: list[int]) -> SampleSpec: ...

    def _prefill_one(self) -> None:
        """Run the oldest queued prefills in one engine call and sample their first tokens.

        Policy: one prefill call per iteration, so running sessions wait for at most one
        call; the call takes the oldest waiting request plus those after it (first come,
        first served) while their prompts fit ``prefill_token_budget``. A failing call
        is retried one request at a time, so a bad request fails alone.
        """
        group = self._prefills.next_group(
            lambda ticket: ticket.slot_held and not self._ended_early(ticket))
        if not group:
            return
        t0 = self._clock()
        for ticket, _ in group:
            self.stats.prefill_wait_ms += (t0 - ticket.submitted_at) * 1e3
            ticket.prefill_started_at = t0
        if not self._prefill_group(group, t0, fail_alone=len(group) == 1):
            log.warning("a prefill of %d requests failed; retrying them one by one", len(group))
            for one in group:
                self._prefill_group([one], self._clock(), fail_alone=True)

    def _prefill_group(self, group: list[tuple[Ticket, PrefillRequest]], t0: float, *,
                       fail_alone: bool) -> bool:
        """One engine prefill call for the group; False when it failed and ``fail_alone``
        is off (the caller retries each request), else the requests fail with the error."""
        try:
            logits = self.engine.prefill([req for _, req in group])  # [R, V]
        except Exception as exc:  # the requests fail, the loop goes on
            if not fail_alone:
                return False
            for ticket, _ in group:
                self._end(ticket, Failure(as_error(exc, "prefill")))
            return True
        self._finish_prefills(group, logits, t0)
        return True

    def _finish_prefills(self, group: list[tuple[Ticket, PrefillRequest]],
                         logits: torch.Tensor, t0: float, *, own_call: bool = True) -> None:
        """Sample each prefilled request's first token (checking one hidden draft)."""
        now = self._clock()
        specs, drafts_of = [], []
        for ticket, _ in group:
            self._read_mailbox(ticket)
            ticket.session.mark_prefilled((now - (ticket.prefill_started_at or t0)) * 1e3)
            drafts = ticket.session.drafts_now()  # at most one hidden draft
            drafts_of.append(drafts)
            specs.append(self._spec(ticket, 1, drafts))
        try:
            verdicts = self.sampler(logits, specs)
        except Exception as exc:
            error = as_error(exc, "prefill")
            for ticket, _ in group:
                self._end(ticket, Failure(error))
            return
        self.stats.prefills += len(group)
        if own_call:
            self.stats.prefill_ms += (self._clock() - t0) * 1e3
        for (ticket, _), verdict, drafts in zip(group, verdicts, drafts_of, strict=True):
            done = ticket.session.commit(verdict.accepted, verdict.tokens, len(drafts), 0.0)
            self._outbox.post(ticket, done)
            if done.finish_reason is None:
                self._running.append(ticket)

    def _prefill_chunk(self) -> list[Piece]:
        """One chunked prefill call: pieces of the oldest prompts within this iteration's
        budget (``ChunkPolicy.budget``: a step's worth while sessions decode, whole
        prompts otherwise); the requests whose last piece it wrote get their first
        token. A failing call is retried one piece at a time, so a bad request fails
        alone. With mixed steps and sessions decoding, the pieces are returned to ride
        the step's forward instead (:meth:`_step_all`)."""
        head = self._prefills.peek()
        if head is None:
            return []
        running = len(self._running)
        sessions = max(running, self._last_step[0]) if running else 0
        budget = self.chunking.budget(self.chunk_cost, sessions,
                                      max(sessions, self._last_step[1]),
                                      self._prefills.token_budget)
        if budget is None:  # nothing decodes: whole prompts, as without chunks
            budget = max(self._prefills.token_budget, head.length - head.done)
        pieces = self._prefills.next_pieces(
            budget, lambda ticket: ticket.slot_held and not self._ended_early(ticket))
        if not pieces:
            return []
        t0 = self._clock()
        for piece in pieces:
            if not piece.pending.started:
                piece.pending.started = True
                self.stats.prefill_wait_ms += (t0 - piece.pending.ticket.submitted_at) * 1e3
                piece.pending.ticket.prefill_started_at = t0
        if self.mixed_steps and self._running:
            return pieces
        self._run_pieces(pieces, t0)
        return []

    def _run_pieces(self, pieces: list[Piece], t0: float) -> None:
        """The pieces in a prefill call of their own, one at a time if the call fails."""
        if not self._prefill_pieces(pieces, t0, fail_alone=len(pieces) == 1):
            log.warning("a chunked prefill of %d pieces failed; retrying them one by one",
                        len(pieces))
            for one in pieces:
                self._prefill_pieces([one], self._clock(), fail_alone=True)

    def _prefill_pieces(self, pieces: list[Piece], t0: float, *, fail_alone: bool) -> bool:
        """One engine call for the pieces; as :meth:`_prefill_group`."""
        engine = self.engine
        assert isinstance(engine, ChunkedPrefillEngine)
        try:
            logits = engine.prefill_chunks(self._chunks_of(pieces))  # [R, V]
        except Exception as exc:
            if not fail_alone:
                return False
            for piece in pieces:
                self._end(piece.pending.ticket, Failure(as_error(exc, "prefill")))
            return True
        self._after_pieces(pieces, logits, t0, own_call=True)
        return True

    def _chunks_of(self, pieces: list[Piece]) -> list[PrefillChunk]:
        """Each piece's rows of its prompt's embeddings (made at its first piece)."""
        engine = self.engine
        assert isinstance(engine, ChunkedPrefillEngine)
        chunks = []
        for piece in pieces:
            p = piece.pending
            if p.embeds is None:
                p.first = piece.start
                p.embeds = engine.prompt_embeds(p.request, p.first)  # [L - first, H]
            chunks.append(PrefillChunk(
                p.request.slot, piece.start, p.embeds[piece.start - p.first : piece.end - p.first],
                tuple(int(i) for i in p.request.input_ids[piece.start : piece.end])))
        return chunks

    def _after_pieces(self, pieces: list[Piece], logits: torch.Tensor, t0: float, *,
                      own_call: bool) -> None:
        """The pieces are written: advance them; the prompts they finished get their
        first token from ``logits`` [R, V] (row r: piece r's last position). Prefill time
        is counted only for a call of their own (``own_call``), not a mixed step."""
        engine = self.engine
        assert isinstance(engine, ChunkedPrefillEngine)
        PrefillQueue.advance(pieces)
        self.stats.prefill_chunks += len(pieces)
        done = [i for i, piece in enumerate(pieces) if piece.finishes]
        for i in done:
            pieces[i].pending.embeds = None
            if self.prefix_cache is not None:
                keep_prefix(engine, self.prefix_cache, pieces[i].pending)
        if not done:
            if own_call:
                self.stats.prefill_ms += (self._clock() - t0) * 1e3
            return
        rows = logits.index_select(0, torch.tensor(done, device=logits.device))  # [D, V]
        self._finish_prefills([(pieces[i].pending.ticket, pieces[i].pending.request)
                               for i in done], rows, t0, own_call=own_call)


def as_error(exc: Exception, what: str) -> EventSpecError:
    """Engine errors reach the request as they are; anything else is logged and reported
    as UNAVAILABLE (the server is at fault, and a retry elsewhere may succeed)."""
    if isinstance(exc, EventSpecError):
        return exc
    log.exception("engine %s failed", what)
    return Unavailable(f"the verifier's engine failed during {what}: {type(exc).__name__}")
