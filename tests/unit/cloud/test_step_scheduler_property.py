"""Property test of the scheduler's plans without an engine (issue 37): any sequence of
admits, prefill submissions, draft offers, cancels, releases and loop iterations, with
whole prompts, chunks in calls of their own or chunks riding the step, gives plans where

- every running session appears exactly once in each step, none cancelled, none whose
  slot was given back (with ``--sit-out`` on, less the speculating sessions that sit the
  step out: never all, never one twice in a row);
- prefills are first come, first served: each call starts with the oldest waiting
  request and takes the next ones in order, within the token budget (whole prompts) or
  the chunk budget (pieces, of which only the last may stop short of its prompt's end,
  and each prompt's pieces follow on from one another);
- the answers are target-only's (or a prefix of them, for a cancel or a disconnect), no
  request hears anything after its release, and every slot comes back exactly once.

The engine loop is played by ``tests.support.step_driver`` with the fake model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventspec.cloud.scheduling.tickets import Failure, Ticket
from eventspec.cloud.speculation.decoding import Committed
from eventspec.cloud.speculation.sit_out import SitOut
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.types import FinishReason
from tests.support.fake_engine import TEXT_VOCAB, target_only
from tests.support.step_driver import MAX_SEQ, Driver

#: Cancels and releases end requests, so they come up less often than the rest.
KINDS = ["admit"] * 3 + ["submit"] * 3 + ["offer"] * 2 + ["iterate"] * 3 + ["cancel", "release"]
#: (kind, who, n, k, flag): ``who`` names a request modulo those admitted so far; ``n``
#: is a prompt length, an answer cap or an error rate, ``k`` a draft count or a number
#: of iterations.
ops = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 1 << 16), st.integers(1, 16),
                         st.integers(0, 6), st.booleans()), min_size=16, max_size=100)
Op = tuple[str, int, int, int, bool]


@dataclass
class Stream:
    """What one request's stream knows."""

    ticket: Ticket
    prompt: tuple[int, ...]
    max_new: int
    submitted: bool = False
    released: bool = False
    received: list[int] = field(default_factory=list)
    finish: FinishReason | None = None

    @property
    def truth(self) -> list[int]:
        return target_only(self.prompt, self.max_new, MAX_SEQ)


class Run:
    """The operations applied to a :class:`Driver`, checking each plan as it is made."""

    def __init__(self, d: Driver) -> None:
        self.d = d
        self.streams: list[Stream] = []
        self.seen = 0  # events read so far
        self.written: dict[int, list[tuple[int, int]]] = {}  # pieces by id(ticket)
        self.lengths: dict[int, int] = {}  # prompt lengths of the waiting, by id(ticket)

    def apply(self, op: Op) -> None:
        kind, who, n, k, flag = op
        if kind == "admit":
            i = len(self.streams)
            prompt = tuple(3 + (i * 7 + j * 13) % (TEXT_VOCAB - 3) for j in range(1 + n % 14))
            ticket = self.d.admit(prompt, n, speculative=flag)
            if ticket is not None:
                self.streams.append(Stream(ticket, prompt, n))
            return
        if kind == "iterate":
            for _ in range(1 + k):
                self.iterate()
            return
        # A stream that was released said its last word; one that finished hears no more.
        candidates = [s for s in self.streams if not s.released and (
            not s.submitted if kind == "submit" else s.finish is None or kind == "release")]
        if not candidates:
            return
        s = candidates[who % len(candidates)]
        if kind == "submit":  # a burst of up to 3, arriving together
            for s in candidates[who % len(candidates) :][: 1 + k % 3]:
                s.submitted = True
                self.d.submit(s.ticket)
        elif kind == "offer":
            base, wrong_every = len(s.received), n % 4
            drafts = [t if not wrong_every or (base + j) % wrong_every else (t + 1) % TEXT_VOCAB
                      for j, t in enumerate(s.truth[base : base + k])]
            if drafts:
                self.d.offer(s.ticket, base, drafts)
        elif kind == "cancel":
            self.d.cancel(s.ticket)
        elif kind == "release":
            s.released = True
            self.d.release(s.ticket)

    def iterate(self) -> None:
        d = self.d
        d.take_commands()
        queue = d.sched.prefills.tickets()
        eligible = [t for t in queue if not t.cancel_requested]
        self.lengths = {id(t): len(self.prompt_of(t)) for t in queue}
        running_before = bool(d.sched.running)
        head = d.sched.prefills.peek()
        head_rest = 0 if head is None else head.length - head.done
        plans = len(d.prefill_plans)
        d.iterate()
        if len(d.prefill_plans) > plans:
            self.check_prefill(queue, eligible, running_before, head_rest)
        else:
            assert not eligible, "a request waited and no prefill was planned"
        self.read_events()

    def prompt_of(self, ticket: Ticket) -> tuple[int, ...]:
        return next(s.prompt for s in self.streams if s.ticket is ticket)

    def check_prefill(self, queue: Sequence[Ticket], eligible: Sequence[Ticket], running: bool,
                      head_rest: int) -> None:
        d = self.d
        plan = d.prefill_plans[-1]
        tickets = list(dict.fromkeys(plan.tickets))  # in order, each once
        assert tickets == list(eligible[: len(tickets)]), "not first come, first served"
        if not plan.pieces:
            tokens = sum(len(r.input_ids) for _, r in plan.group)
            assert len(plan.group) == 1 or tokens <= d.budget, "over the token budget"
            if len(tickets) < len(eligible):  # it stopped at one that did not fit
                stop = queue.index(eligible[len(tickets)])
                after = queue[queue.index(tickets[-1]) + 1 : stop + 1]
                assert any(tokens + self.lengths[id(t)] > d.budget for t in after), \
                    "a waiting prompt that fitted was left for later"
            return
        assert plan.ride == (d.mixed and running)
        budget = d.chunk if running else max(d.budget, head_rest)
        assert sum(p.end - p.start for p in plan.pieces) <= max(1, budget)
        assert all(p.finishes for p in plan.pieces[:-1]), "only the last piece may stop short"
        for p in plan.pieces:
            spans = self.written.setdefault(id(p.pending.ticket), [])
            assert p.start == (spans[-1][1] if spans else 0), "a prompt's pieces do not follow on"
            spans.append((p.start, p.end))

    def read_events(self) -> None:
        by_ticket = {id(s.ticket): s for s in self.streams}
        for ticket, event in self.d.events[self.seen :]:
            s = by_ticket[id(ticket)]
            assert not s.released, "a released request heard more"
            assert not isinstance(event, Failure), event.error
            assert isinstance(event, Committed) and s.finish is None
            assert event.start == len(s.received)
            s.received.extend(event.tokens)
            s.finish = event.finish_reason
        self.seen = len(self.d.events)

    def finish(self) -> None:
        """The loop runs until every submitted request has its answer; then every stream
        lets go, and nothing is left."""
        for _ in range(4 * MAX_SEQ):
            self.iterate()
            if self.d.sched.idle:
                break
        assert self.d.sched.idle, "a request never finished"
        for s in self.streams:
            if not s.released:
                s.released = True
                self.d.release(s.ticket)
        self.iterate()
        assert self.d.sched.idle
        assert self.d.sched.pool.free == self.d.num_slots, "a slot leaked"
        assert self.d.freed == self.d.admitted, "a slot was not given back exactly once"
        for s in self.streams:
            truth = s.truth
            if s.finish in (FinishReason.EOS, FinishReason.MAX_TOKENS):
                assert s.received == truth, (s.prompt, s.received, truth)
            else:
                assert s.received == truth[: len(s.received)], (s.prompt, s.received, truth)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=ops, num_slots=st.integers(1, 6), budget=st.integers(1, 40),
       mode=st.sampled_from(["whole", "chunks", "mixed"]), chunk=st.integers(1, 12),
       width=st.sampled_from([None, CloudCost(50.0, 0.1, 0.1, 5.0, 2.0,
                                              step_ms_per_session=0.5)]),
       sit_out=st.sampled_from([SitOut(0), SitOut(2)]))
def test_any_sequence_of_requests_gives_sound_plans(
        operations: list[Op], num_slots: int, budget: int, mode: str, chunk: int,
        width: CloudCost | None, sit_out: SitOut) -> None:
    d = Driver(num_slots, budget=budget, chunk=0 if mode == "whole" else chunk,
               mixed=mode == "mixed", verify_cost=width, sit_out=sit_out)
    run = Run(d)
    for op in operations:
        run.apply(op)
    run.finish()
