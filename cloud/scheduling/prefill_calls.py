"""The engine loop's prefill calls: a :class:`~eventspec.cloud.scheduling.step_plan.PrefillPlan` run
on the engine, whole prompts in grouped calls or prompt pieces (chunked prefill, a
reused prefix's rest) in calls of their own, then the sampler call for the first tokens
of the prompts it finished. Kept apart from the loop (``eventspec.cloud.scheduling.engine_loop``),
which holds the thread and the step, so the retry rule reads in one place: a call that
fails is retried one request (or piece) at a time, so a bad request fails alone.

What to run and what the results do is the scheduler's
(``eventspec.cloud.scheduling.step_scheduler``); this module only runs it. The prefix cache's
engine work (copying a hit's K/V in, saving a written prefix) is here too, since it
touches the engine's KV.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from eventspec.cloud.engine.base import (
    AheadEmbedsEngine,
    BatchedEngine,
    ChunkedPrefillEngine,
    PrefillChunk,
    PrefillRequest,
)
from eventspec.cloud.scheduling.prefill_queue import Pending, Piece
from eventspec.cloud.scheduling.prefix_cache import PrefixCache, keep_prefix, reuse_prefix
from eventspec.cloud.scheduling.sampler import BatchedSampler
from eventspec.cloud.scheduling.step_plan import PrefillPlan
from eventspec.cloud.scheduling.step_scheduler import StepScheduler
from eventspec.cloud.scheduling.tickets import Ticket
from eventspec.shared.contract.errors import EventSpecError, Unavailable

log = logging.getLogger("eventspec.cloud.scheduling.scheduler")


class PrefillCalls:
    """Runs prefill plans on ``engine`` and their first tokens through ``sampler``."""

    def __init__(self, engine: BatchedEngine, scheduler: StepScheduler, sampler: BatchedSampler,
                 *, prefix_cache: PrefixCache | None = None, video_token_id: int = -1,
                 preprocess_frames: Callable[[Sequence[bytes]], torch.Tensor] | None = None,
                 clock: Callable[[], float]) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.sampler = sampler
        self.prefix_cache = prefix_cache
        self._video_token_id = video_token_id
        self._preprocess_frames = preprocess_frames
        self._clock = clock
        #: The engine as a side-stream one, or None. Decided here once: the check is a
        #: runtime Protocol's (attribute look-ups), and ``embed_ahead`` runs per step.
        self._ahead = engine if isinstance(engine, AheadEmbedsEngine) else None

    def reuse_prefixes(self, queued: Sequence[Pending]) -> None:
        """Look newly queued prefills up in the prefix cache (a hit's K/V is copied into
        its slot); one whose deferred frames fail to preprocess fails alone."""
        if self.prefix_cache is None:
            return
        engine = self.engine
        assert isinstance(engine, ChunkedPrefillEngine)
        for pending in queued:
            if not pending.ticket.slot_held:  # released in the same batch of commands
                continue
            try:
                reuse_prefix(engine, self.prefix_cache, pending, self._video_token_id,
                             self._preprocess_frames)
            except Exception as exc:  # its deferred frames failed: it alone fails
                self.scheduler.fail([pending.ticket], as_error(exc, "prefill"))

    def embed_ahead(self, pendings: Sequence[Pending]) -> None:
        """Start each prompt's video tower now, on the engine's side stream
        (:mod:`eventspec.cloud.engine.ahead`), so its first piece finds the embeddings
        made; one the engine rejects fails alone. A no-op for engines without a side
        stream, and free with no ``pendings`` (it runs after every step launch)."""
        engine = self._ahead
        if not pendings or engine is None:
            return
        for pending in pendings:
            if not pending.ticket.slot_held:
                continue
            try:
                pending.ahead = engine.prompt_embeds_ahead(pending.request, pending.done)
            except Exception as exc:
                self.scheduler.fail([pending.ticket], as_error(exc, "prefill"))

    def run(self, plan: PrefillPlan) -> None:
        """The plan's call (one of its own; the caller runs a riding plan in its step)."""
        if plan.pieces:
            self.run_pieces(plan.pieces, plan.t0)
            return
        group = list(plan.group)
        if not self._prefill_group(group, plan.t0, fail_alone=len(group) == 1):
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
            self.scheduler.fail([ticket for ticket, _ in group], as_error(exc, "prefill"))
            return True
        self._first_tokens([ticket for ticket, _ in group], logits, t0, own_call=True)
        return True

    def _first_tokens(self, tickets: list[Ticket], logits: torch.Tensor, t0: float, *,
                      own_call: bool) -> None:
        """Sample each prefilled request's first token from its row of ``logits`` [R, V]."""
        plan = self.scheduler.first_tokens(tickets, t0, own_call=own_call)
        try:
            verdicts = self.sampler(logits, plan.specs)
        except Exception as exc:
            self.scheduler.fail(tickets, as_error(exc, "prefill"))
            return
        self.scheduler.update_prefill(plan, verdicts)

    def run_pieces(self, pieces: Sequence[Piece], t0: float) -> None:
        """The pieces in a prefill call of their own, one at a time if the call fails."""
        if not self._prefill_pieces(pieces, t0, fail_alone=len(pieces) == 1):
            log.warning("a chunked prefill of %d pieces failed; retrying them one by one",
                        len(pieces))
            for one in pieces:
                self._prefill_pieces([one], self._clock(), fail_alone=True)

    def _prefill_pieces(self, pieces: Sequence[Piece], t0: float, *, fail_alone: bool) -> bool:
        """One engine call for the pieces; as :meth:`_prefill_group`."""
        engine = self.engine
        assert isinstance(engine, ChunkedPrefillEngine)
        try:
            logits = engine.prefill_chunks(self.chunks_of(pieces))  # [R, V]
        except Exception as exc:
            if not fail_alone:
                return False
            self.scheduler.fail([p.pending.ticket for p in pieces], as_error(exc, "prefill"))
            return True
        self.after_pieces(pieces, logits, t0, own_call=True)
        return True

    def chunks_of(self, pieces: Sequence[Piece]) -> list[PrefillChunk]:
        """Each piece's rows of its prompt's embeddings (made at its first piece)."""
        engine = self.engine
        assert isinstance(engine, ChunkedPrefillEngine)
        chunks = []
        for piece in pieces:
            p = piece.pending
            if p.embeds is None and p.ahead is not None and p.ahead.start == piece.start:
                p.first = piece.start
                p.embeds = p.ahead.take()  # [L - first, H]
            elif p.embeds is None:
                p.first = piece.start
                p.embeds = engine.prompt_embeds(p.request, p.first)  # [L - first, H]
            p.ahead = None
            chunks.append(PrefillChunk(
                p.request.slot, piece.start, p.embeds[piece.start - p.first : piece.end - p.first],
                tuple(int(i) for i in p.request.input_ids[piece.start : piece.end])))
        return chunks

    def after_pieces(self, pieces: Sequence[Piece], logits: torch.Tensor, t0: float, *,
                     own_call: bool) -> None:
        """The pieces are written: the prompts they finished keep their prefix (a miss
        with the cache on) and get their first token from ``logits`` [R, V] (row r: piece
        r's last position). Prefill time is counted only for a call of their own
        (``own_call``), not a mixed step."""
        engine = self.engine
        assert isinstance(engine, ChunkedPrefillEngine)
        done = self.scheduler.pieces_written(pieces, t0, own_call=own_call)
        for i in done:
            pieces[i].pending.embeds = None
            if self.prefix_cache is not None:
                keep_prefix(engine, self.prefix_cache, pieces[i].pending)
        if not done:
            return
        rows = logits.index_select(0, torch.tensor(done, device=logits.device))  # [D, V]
        self._first_tokens([pieces[i].pending.ticket for i in done], rows, t0,
                           own_call=own_call)


def as_error(exc: Exception, what: str) -> EventSpecError:
    """Engine errors reach the request as they are; anything else is logged and reported
    as UNAVAILABLE (the server is at fault, and a retry elsewhere may succeed)."""
    if isinstance(exc, EventSpecError):
        return exc
    log.exception("engine %s failed", what)
    return Unavailable(f"the verifier's engine failed during {what}: {type(exc).__name__}")
