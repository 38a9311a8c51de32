"""The engine loop's decisions, apart from its execution: what each engine call runs, and
what its results do to the requests. No engine, no sampler, no thread.

vLLM V1's ``schedule()`` / ``update_from_output()`` shape, adapted to this loop. Each
iteration:

1. :meth:`StepScheduler.take_commands`: prefills to queue, releases, stop;
2. :meth:`StepScheduler.schedule_prefill`: the oldest waiting prompts, whole (first
   come, first served, as many as fit ``prefill_token_budget`` tokens, at least one) or
   in pieces (``eventspec.cloud.scheduling.prefill_chunking``), and whether the pieces ride the
   step;
3. after the engine call, :meth:`StepScheduler.first_tokens` says what the sampler checks
   for the prompts it finished (one row each, at most one hidden draft) and
   :meth:`StepScheduler.update_prefill` commits their first tokens; those still going
   join the running sessions;
4. :meth:`StepScheduler.schedule_step`: every running session once, with what it feeds
   (C[-1] plus its valid drafts, cut to the width that pays under ``--verify-width
   auto``); :meth:`StepScheduler.update_step` commits the sampler's verdicts under each
   session's stop rules.

The step is planned after the prefill's update, not with it: the prefill's first tokens
decide which new sessions step (a first token can end a request), and a new session
steps in the same iteration as its prefill, as it did before the split.

Every result goes to the :class:`~eventspec.cloud.scheduling.tickets.Outbox`, which the
loop hands to the event loop; a request that ends (finished, failed, cancelled, overdue)
gives its KV slot back here (``free_kv``: the engine's ``free``). Policy: every running
session steps every iteration (none starves), except that with ``--sit-out`` on (off by
default) a dry session in a loaded batch whose drafts are on their way may sit one step
out (:mod:`eventspec.cloud.speculation.sit_out`); one prefill call per iteration.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.scheduling.kv_arena import ArenaPool
from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy, slack_for
from eventspec.cloud.scheduling.prefill_queue import (
    AHEAD_PROMPTS,
    DEFAULT_PREFILL_TOKEN_BUDGET,
    Pending,
    Piece,
    PrefillQueue,
)
from eventspec.cloud.scheduling.sampler import SampleSpec, Verdict
from eventspec.cloud.scheduling.stats import SchedulerStats
from eventspec.cloud.scheduling.step_assembly import trim_drafts
from eventspec.cloud.scheduling.step_plan import FirstTokens, PrefillPlan, SessionStep, StepPlan
from eventspec.cloud.scheduling.tickets import Failure, Outbox, SchedulerEvent, SlotPool, Ticket
from eventspec.cloud.speculation.decoding import Committed
from eventspec.cloud.speculation.sit_out import SitOut
from eventspec.shared.contract.errors import EventSpecError, Unavailable
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.types import FinishReason

Command = tuple[str, Ticket | None, object]
#: Whole prompts always (no ``--prefill-chunk``).
NO_CHUNKS = ChunkPolicy("off")
#: Every running session steps every iteration (``--sit-out off``).
NEVER_SIT_OUT = SitOut(0)


def _keep_kv(slot: int) -> None:
    """The default ``free_kv``: no engine holds anything for the slot."""


def neutral_prior() -> float:
    """The acceptance drafts are expected to have when nothing better is known."""
    return 0.5


class StepScheduler:
    """The requests' state in the loop (waiting prefills, running sessions, commands)
    and the plans made from it. Only the engine thread calls it, except :meth:`enqueue`
    (any thread) and the length of :attr:`prefills` (read anywhere, approximate)."""

    def __init__(
        self,
        pool: SlotPool | ArenaPool,
        *,
        free_kv: Callable[[int], None] = _keep_kv,
        prefill_token_budget: int = DEFAULT_PREFILL_TOKEN_BUDGET,
        chunking: ChunkPolicy = NO_CHUNKS,
        pieces: bool = False,
        mixed_steps: bool = False,
        chunk_cost: CloudCost | None = None,
        verify_cost: CloudCost | None = None,
        alpha_prior: Callable[[], float] = neutral_prior,
        padded_tokens: Callable[[int], int] | None = None,
        sit_out: SitOut = NEVER_SIT_OUT,
        towers_ahead: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``pieces``: prompts go through the pieces path (chunking on, or a prefix cache);
        ``mixed_steps``: pieces ride the step while sessions decode; ``chunk_cost``: the
        cost model ``auto`` chunks are sized from; ``verify_cost`` (None: verify every
        valid draft), ``alpha_prior`` and ``padded_tokens``: the verify-width rule
        (``eventspec.cloud.scheduling.step_assembly``); ``sit_out``: which dry sessions wait a step
        in a loaded batch (``eventspec.cloud.speculation.sit_out``); ``towers_ahead``: the
        loop makes prompts' embeddings ahead on the engine's side stream
        (``EngineLoop._start_towers``), so while sessions decode a prompt's first piece
        waits for them."""
        self.prefills = PrefillQueue(prefill_token_budget)  # checks the budget first
        self.pool = pool
        self.chunking = chunking
        self.pieces = pieces
        self.mixed_steps = mixed_steps
        self.chunk_cost = chunk_cost
        self.verify_cost = verify_cost
        self.alpha_prior = alpha_prior
        self.padded_tokens = padded_tokens
        self.sit_out = sit_out
        self.towers_ahead = towers_ahead
        #: ``--prefill-chunk slack``'s estimates and rule (None under other policies).
        self.slack = slack_for(chunking, chunk_cost, pool.max_seq_len, prefill_token_budget)
        self.stats = SchedulerStats()
        self.outbox = Outbox()
        self.running: list[Ticket] = []
        self.stopping = False
        self.last_step = (0, 0)  # sessions and tokens of the latest step (chunk sizing)
        self._free_kv = free_kv
        self._clock = clock
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing waits: the loop may block for the next command."""
        return not self.running and not self.prefills

    # -- commands (from the streams) ---------------------------------------------------------

    def enqueue(self, kind: str, ticket: Ticket | None = None, payload: object = None) -> None:
        """A command for the next iteration (any thread): "prefill" (``payload``: its
        :class:`PrefillRequest`), "release", "wake" or "stop"."""
        self._commands.put((kind, ticket, payload))

    def take_commands(self, *, block: bool) -> list[Pending]:
        """Apply the commands that arrived (waiting for one if ``block``); returns the
        prefills queued by them, for the loop's prefix-cache lookups."""
        queued: list[Pending] = []
        try:
            cmd = self._commands.get() if block else self._commands.get_nowait()
        except queue.Empty:
            return queued
        while True:
            kind, ticket, payload = cmd
            if kind == "stop":
                self.stopping = True
            elif kind == "prefill" and ticket is not None and ticket.slot_held:
                assert isinstance(payload, PrefillRequest)
                queued.append(self.prefills.add(ticket, payload))
            elif kind == "release" and ticket is not None:
                self.forget(ticket)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return queued

    # -- prefills ------------------------------------------------------------------------------

    def schedule_prefill(self) -> PrefillPlan | None:
        """This iteration's prefill call, or None when no prompt waits."""
        return self._schedule_pieces() if self.pieces else self._schedule_group()

    def _schedule_group(self) -> PrefillPlan | None:
        """Whole prompts: the oldest waiting request plus those after it while their
        prompts fit the token budget (``PrefillQueue.next_group``)."""
        group = self.prefills.next_group(self._still_wanted)
        if not group:
            return None
        t0 = self._clock()
        for ticket, _ in group:
            self.stats.prefill_wait_ms += (t0 - ticket.submitted_at) * 1e3
            ticket.prefill_started_at = t0
        return PrefillPlan(t0, group=tuple(group))

    def _schedule_pieces(self) -> PrefillPlan | None:
        """Pieces of the oldest prompts within this iteration's budget
        (``ChunkPolicy.budget``: about a step's worth while sessions decode, whole
        prompts otherwise; under ``slack``, :class:`PieceSlack` sizes it from the
        measured times); with mixed steps and sessions decoding they ride the step.
        With ``towers_ahead`` and sessions decoding, a prompt whose tower is not made
        yet waits (with those behind it) rather than hold the step up; with none
        decoding nothing is gained by waiting, and its piece makes its embeddings."""
        head = self.prefills.peek()
        if head is None:
            return None
        running = len(self.running)
        sessions = max(running, self.last_step[0]) if running else 0
        tokens = max(sessions, self.last_step[1])
        budget: int | None
        if self.slack is not None and sessions:
            now = self._clock()
            waited_ms = (now - head.ticket.submitted_at) * 1e3
            beside = (len(self.prefills.towers_to_start(AHEAD_PROMPTS))
                      if self.towers_ahead else 0)  # EngineLoop._start_towers, after launch
            outlook = self.prefills.outlook(now, towers_in_step=not self.towers_ahead)
            budget = self.slack.choose(sessions, tokens, outlook, waited_ms=waited_ms,
                                       beside=beside).tokens
        else:
            budget = self.chunking.budget(self.chunk_cost, sessions, tokens,
                                          self.prefills.token_budget)
        if budget is None:  # nothing decodes: whole prompts, as without chunks
            budget = max(self.prefills.token_budget, head.length - head.done)
        pieces = self.prefills.next_pieces(budget, self._still_wanted,
                                           wait_for_towers=self.towers_ahead and running > 0)
        if not pieces:
            return None
        t0 = self._clock()
        for piece in pieces:
            if not piece.pending.started:
                piece.pending.started = True
                self.stats.prefill_wait_ms += (t0 - piece.pending.ticket.submitted_at) * 1e3
                piece.pending.ticket.prefill_started_at = t0
        return PrefillPlan(t0, pieces=tuple(pieces), ride=self.mixed_steps and bool(self.running))

    def pieces_written(self, pieces: Sequence[Piece], t0: float, *, own_call: bool) -> list[int]:
        """The pieces' call wrote them: advance their prompts; returns the indices of
        those that finished a prompt (they get a first token). A call of its own that
        finished none counts its time as prefill time here."""
        PrefillQueue.advance(list(pieces))
        self.stats.prefill_chunks += len(pieces)
        done = [i for i, piece in enumerate(pieces) if piece.finishes]
        if not done and own_call:
            self.stats.prefill_ms += (self._clock() - t0) * 1e3
        return done

    def first_tokens(self, tickets: Sequence[Ticket], t0: float, *,
                     own_call: bool = True) -> FirstTokens:
        """The prompts are in their slots: what the sampler checks for each first token
        (the drafts that arrived meanwhile, at most one of them hidden)."""
        now = self._clock()
        sessions = []
        for ticket in tickets:
            self._read_mailbox(ticket)
            ticket.session.mark_prefilled((now - (ticket.prefill_started_at or t0)) * 1e3)
            drafts = tuple(ticket.session.drafts_now())  # at most one hidden draft
            sessions.append(SessionStep(ticket, drafts, self._spec(ticket, 1, drafts)))
        return FirstTokens(tuple(sessions), t0, own_call)

    def update_prefill(self, plan: FirstTokens, verdicts: Sequence[Verdict]) -> None:
        """Commit each first token; a session it does not finish starts running."""
        self.stats.prefills += len(plan.sessions)
        if plan.own_call:
            self.stats.prefill_ms += (self._clock() - plan.t0) * 1e3
        for s, verdict in zip(plan.sessions, verdicts, strict=True):
            done = s.ticket.session.commit(verdict.accepted, verdict.tokens, len(s.drafts), 0.0)
            self.outbox.post(s.ticket, done)
            if done.finish_reason is None:
                self.running.append(s.ticket)

    # -- steps ---------------------------------------------------------------------------------

    def schedule_step(self, riding: Sequence[Piece] = ()) -> StepPlan | None:
        """Every running session once, with the tokens it feeds, except those that sit
        this step out (``--sit-out``); None when none runs (a cancelled or overdue one is
        finished here, before it takes engine time)."""
        t_start = self._clock()
        ready = [t for t in list(self.running) if not self.ended_early(t)]
        if not ready:
            return None
        for t in ready:
            self._read_mailbox(t)
        if self.sit_out.applies(len(ready)):
            sitting = self.sit_out.choose([t.session.dry_state() for t in ready])
            for t, sits in zip(ready, sitting, strict=True):
                if sits:
                    t.session.sit_out()
            ready = [t for t, sits in zip(ready, sitting, strict=True) if not sits]
        inputs = [t.session.step_input() for t in ready]
        if self.verify_cost is not None and any(inp.drafts for inp in inputs):
            # The static engine pads every session to the longest: price steps by it.
            inputs = trim_drafts([t.session.counters for t in ready], inputs,
                                 self.verify_cost, self.alpha_prior(), self.padded_tokens)
        sessions = tuple(SessionStep(t, inp.drafts, self._spec(t, len(inp.tokens), inp.drafts), inp)
                         for t, inp in zip(ready, inputs, strict=True))
        return StepPlan(sessions, tuple(riding), t_start)

    def update_step(self, plan: StepPlan, verdicts: Sequence[Verdict], step_ms: float) -> None:
        """Commit each session's verdict under its stop rules; a finished one ends."""
        for s, v in zip(plan.sessions, verdicts, strict=True):
            done = s.ticket.session.commit(v.accepted, v.tokens, len(s.drafts), step_ms)
            if done.finish_reason is None:
                self.outbox.post(s.ticket, done)
            else:
                self.end(s.ticket, done)
        self.last_step = (len(plan.sessions), plan.tokens)

    def step_timed(self, plan: StepPlan, device_ms: float | None, *,
                   towers_beside: int = 0) -> None:
        """The step's device time (None: not read), for ``--prefill-chunk slack``'s
        estimates: a plain step's, or a mixed one's with the pieces and towers it ran,
        and the ``towers_beside`` it on the side stream (started once it was launched)."""
        if self.slack is not None:
            self.slack.observe(len(plan.sessions), plan.tokens,
                               [p.end - p.start for p in plan.riding],
                               sum(p.tower for p in plan.riding) + towers_beside, device_ms,
                               widest=max(len(i.tokens) for i in plan.inputs))

    # -- ends ----------------------------------------------------------------------------------

    def fail(self, tickets: Sequence[Ticket], error: EventSpecError) -> None:
        """The engine or sampler call failed: its requests fail with ``error``."""
        for ticket in tickets:
            self.end(ticket, Failure(error))

    def ended_early(self, ticket: Ticket) -> bool:
        """Finish a cancelled or overdue request before it takes engine time."""
        session = ticket.session
        if ticket.cancel_requested:
            session.finish(FinishReason.CANCELLED)
        elif session.deadline_passed():
            session.finish(FinishReason.DEADLINE)
        else:
            return False
        n = len(session.committed)
        self.end(ticket, Committed(n, (), 0, 0, session.finish_reason))
        return True

    def end(self, ticket: Ticket, event: SchedulerEvent) -> None:
        """Post the request's last result and give its slot back."""
        self.forget(ticket)
        self.outbox.post(ticket, event)

    def forget(self, ticket: Ticket) -> None:
        """Drop the request from the loop and give its slot back (idempotent)."""
        if ticket in self.running:
            self.running.remove(ticket)
        self.prefills.forget(ticket)
        self._free_slot(ticket)

    def shut_down(self) -> None:
        """Fail every request in the loop or on its way in with UNAVAILABLE, and give
        back the slots of those whose streams already let go."""
        down = Unavailable("the verifier's engine loop stopped")
        for t in [*self.running, *self.prefills.tickets()]:
            self.end(t, Failure(down))
        self.running.clear()
        self.prefills.clear()
        while True:  # release what the streams still hold
            try:
                kind, ticket, _ = self._commands.get_nowait()
            except queue.Empty:
                break
            if ticket is not None and kind == "prefill":
                self.end(ticket, Failure(down))
            elif ticket is not None and kind != "stop":
                self._free_slot(ticket)

    # -- helpers -------------------------------------------------------------------------------

    def _still_wanted(self, ticket: Ticket) -> bool:
        return ticket.slot_held and not self.ended_early(ticket)

    def _read_mailbox(self, ticket: Ticket) -> None:
        box = ticket.mailbox
        while box:
            ticket.session.offer_drafts(box.popleft())

    def _spec(self, ticket: Ticket, rows: int, drafts: Sequence[int]) -> SampleSpec:
        s = ticket.session.settings
        return SampleSpec(rows, tuple(drafts), s.temperature, s.top_p, ticket.generator)

    def _free_slot(self, ticket: Ticket) -> None:
        if ticket.slot_held:
            ticket.slot_held = False
            self._free_kv(ticket.slot)
            self.pool.release(ticket.slot)
