"""A bare ``StepScheduler`` driven by hand, no engine, no sampler and no thread: the
tests play the streams (admit, submit, offer, cancel, release) and the engine loop (each
plan answered with the verdicts the fake model of ``tests.support.fake_engine`` gives),
and read every plan and every event.

``Driver.iterate`` is the engine loop's iteration (``eventspec.cloud.scheduling.engine_loop``) with
the engine calls replaced by :func:`greedy_verdict`: take the commands, plan and "run"
the prefill (or let its pieces ride the step), plan the step, answer it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy
from eventspec.cloud.scheduling.prefill_queue import Piece
from eventspec.cloud.scheduling.sampler import Verdict
from eventspec.cloud.scheduling.step_plan import PrefillPlan, SessionStep, StepPlan
from eventspec.cloud.scheduling.step_scheduler import NEVER_SIT_OUT, StepScheduler
from eventspec.cloud.scheduling.tickets import SchedulerEvent, SlotPool, Ticket
from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.cloud.speculation.sit_out import SitOut
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.types import DraftTail, GenerationSettings
from tests.support.fake_engine import EOS, next_token

MAX_SEQ = 64


def greedy_verdict(prompt: Sequence[int], committed: Sequence[int], drafts: Sequence[int],
                   rows: int) -> Verdict:
    """What the greedy sampler returns on the fake model's logits: the drafts it agrees
    with, then its own token (a correction, or a bonus while rows are left)."""
    seq = [*prompt, *committed]
    accepted = 0
    for d in drafts:
        if next_token([*seq, *drafts[:accepted]]) != d:
            break
        accepted += 1
    tokens = [int(d) for d in drafts[:accepted]]
    if accepted < rows:
        tokens.append(next_token([*seq, *tokens]))
    return Verdict(accepted, tokens)


@dataclass
class Driver:
    """One ``StepScheduler`` over ``num_slots`` slots, with what the tests check kept."""

    num_slots: int
    budget: int = 2048
    chunk: int = 0  # tokens per piece (0: whole prompts)
    mixed: bool = False
    verify_cost: CloudCost | None = None
    sit_out: SitOut = NEVER_SIT_OUT
    sched: StepScheduler = field(init=False)
    prompts: dict[int, tuple[int, ...]] = field(default_factory=dict)  # by id(ticket)
    holder: dict[int, Ticket | None] = field(default_factory=dict)  # by slot
    events: list[tuple[Ticket, SchedulerEvent]] = field(default_factory=list)
    prefill_plans: list[PrefillPlan] = field(default_factory=list)
    step_plans: list[StepPlan] = field(default_factory=list)
    admitted: int = 0
    freed: int = 0
    sat_out: int = 0  # session-steps sat out, summed
    _sat_last: set[int] = field(default_factory=set)  # id(ticket)s that sat the last step out
    _clock: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        policy = ChunkPolicy("fixed", self.chunk) if self.chunk else ChunkPolicy("off")
        self.sched = StepScheduler(
            SlotPool(self.num_slots, MAX_SEQ), free_kv=self._free, prefill_token_budget=self.budget,
            chunking=policy, pieces=policy.enabled, mixed_steps=self.mixed and policy.enabled,
            verify_cost=self.verify_cost, sit_out=self.sit_out,
            clock=lambda: float(next(self._clock)))

    def _free(self, slot: int) -> None:
        assert self.holder.get(slot) is not None, f"slot {slot} freed twice"
        self.holder[slot] = None
        self.freed += 1

    # -- the streams -------------------------------------------------------------------------

    def admit(self, prompt: Sequence[int], max_new: int, *, speculative: bool = True,
              max_verify_tokens: int = 5) -> Ticket | None:
        """A request with its slot, or None when none is free (RESOURCE_EXHAUSTED)."""
        pool = self.sched.pool
        if not pool.free:
            return None
        slot = pool.acquire()
        session = DecodingSession(
            settings=GenerationSettings(max_new_tokens=max_new), slot=slot,
            prompt_len=len(prompt), max_seq_len=MAX_SEQ, eos_token_id=EOS,
            max_verify_tokens=max_verify_tokens, decode=lambda ids: "", speculative=speculative)
        ticket = Ticket(f"r{self.admitted}", session, asyncio.Queue(), None)
        self.admitted += 1
        self.prompts[id(ticket)] = tuple(prompt)
        self.holder[slot] = ticket
        return ticket

    def submit(self, ticket: Ticket) -> None:
        ticket.submitted_at = float(next(self._clock))
        self.sched.enqueue("prefill", ticket, PrefillRequest(
            ticket.slot, list(self.prompts[id(ticket)]), video_features=torch.zeros(1)))

    @staticmethod
    def offer(ticket: Ticket, base: int, drafts: Sequence[int]) -> None:
        ticket.mailbox.append(DraftTail(base, tuple(drafts)))

    def cancel(self, ticket: Ticket) -> None:
        ticket.cancel_requested = True
        self.sched.enqueue("wake")

    def release(self, ticket: Ticket) -> None:
        self.sched.enqueue("release", ticket)

    # -- the engine loop, with a fake model ----------------------------------------------------

    def verdicts(self, sessions: Sequence[SessionStep]) -> list[Verdict]:
        return [greedy_verdict(self.prompts[id(s.ticket)], s.ticket.session.committed,
                               s.drafts, s.spec.rows) for s in sessions]

    def take_commands(self) -> None:
        self.sched.take_commands(block=False)

    def iterate(self) -> None:
        """One engine-loop iteration after the commands were taken."""
        sched = self.sched
        plan = sched.schedule_prefill()
        riding: Sequence[Piece] = ()
        if plan is not None:
            self.prefill_plans.append(plan)
            self.check_held(plan.tickets)
            if plan.ride:
                riding = plan.pieces
            elif plan.pieces:
                self._pieces(plan.pieces, plan.t0, own_call=True)
            else:
                self._first_tokens([t for t, _ in plan.group], plan.t0, own_call=True)
        step = sched.schedule_step(riding)
        if step is None:
            if riding:
                self._pieces(riding, float(next(self._clock)), own_call=True)
        else:
            self.step_plans.append(step)
            self.check_step(step)
            if step.riding:
                self._pieces(step.riding, step.t_start, own_call=False)
            sched.update_step(step, self.verdicts(step.sessions), 1.0)
        self.events.extend(sched.outbox.drain())

    def _pieces(self, pieces: Sequence[Piece], t0: float, *, own_call: bool) -> None:
        done = self.sched.pieces_written(pieces, t0, own_call=own_call)
        if done:
            self._first_tokens([pieces[i].pending.ticket for i in done], t0, own_call=own_call)

    def _first_tokens(self, tickets: Sequence[Ticket], t0: float, *, own_call: bool) -> None:
        first = self.sched.first_tokens(tickets, t0, own_call=own_call)
        self.sched.update_prefill(first, self.verdicts(first.sessions))

    def check_step(self, step: StepPlan) -> None:
        """Right after planning: the plan is the running sessions, each once, each
        holding its slot, none cancelled; with ``sit_out`` on, less the speculating ones
        that sit this step out: never all of them, never one twice in a row."""
        tickets = step.tickets
        assert len({id(t) for t in tickets}) == len(tickets), "a session twice in one step"
        running = self.sched.running
        stepping = {id(t) for t in tickets}
        sat = [t for t in running if id(t) not in stepping]
        assert tickets == [t for t in running if id(t) in stepping], "a session was added"
        if not self.sit_out.applies(len(running)):
            assert not sat, "a running session was left out"
        assert tickets, "every session sat the step out"
        for t in sat:
            assert t.session.speculative, "a target-only session sat a step out"
            assert id(t) not in self._sat_last, "a session sat two steps out in a row"
        self._sat_last = {id(t) for t in sat}
        self.sat_out += len(sat)
        self.check_held(tickets)

    def check_held(self, tickets: Sequence[Ticket]) -> None:
        """Planned requests hold their slots and were neither cancelled nor finished."""
        for t in tickets:
            assert t.slot_held and self.holder.get(t.slot) is t, "a freed slot was scheduled"
            assert not t.cancel_requested, "a cancelled request was planned"
            assert t.session.finish_reason is None
