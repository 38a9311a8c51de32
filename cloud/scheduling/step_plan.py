"""What the scheduler decides and the engine loop carries out: the plans of one iteration.

vLLM V1's split, adapted: ``StepScheduler.schedule_*``
(``eventspec.cloud.scheduling.step_scheduler``)
returns a plan made of these values, the engine loop (``eventspec.cloud.scheduling.engine_loop``)
runs
the engine and the sampler on it, and ``StepScheduler.update_*`` takes the sampler's
verdicts back. An iteration has two plans, not one: a prefill call's first tokens decide
which new sessions join the step after it (a first token may end the request, a call may
fail), so the step is planned once the prefill's result is in.

Plain values, no engine and no threads, so the tests build and read them directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.scheduling.prefill_queue import Piece
from eventspec.cloud.scheduling.sampler import SampleSpec
from eventspec.cloud.scheduling.tickets import Ticket
from eventspec.cloud.speculation.decoding import StepInput


@dataclass(frozen=True)
class PrefillPlan:
    """One prefill call: whole prompts (``group``, oldest first, within the token
    budget) or prompt pieces (``pieces``, chunked prefill or a reused prefix's rest).
    ``ride``: the pieces go through this iteration's step forward (a mixed step)
    instead of a call of their own. ``t0``: when the call was planned (the scheduler's
    clock), which its requests' prefill time counts from."""

    t0: float
    group: tuple[tuple[Ticket, PrefillRequest], ...] = ()
    pieces: tuple[Piece, ...] = ()
    ride: bool = False

    @property
    def tickets(self) -> list[Ticket]:
        """The requests the call writes, in its order."""
        if self.pieces:
            return [piece.pending.ticket for piece in self.pieces]
        return [ticket for ticket, _ in self.group]


@dataclass(frozen=True)
class SessionStep:
    """One session's share of a sampler call: the drafts it checks and its spec (rows,
    drafts, temperature, generator). ``input`` is what it feeds a batched step; None for
    a prefill's first token, whose one row comes from the prefill's logits."""

    ticket: Ticket
    drafts: tuple[int, ...]
    spec: SampleSpec
    input: StepInput | None = None


class SessionsInOrder:
    """What a call over sessions hands the sampler and the tickets: their sample specs
    and tickets, in the sessions' order."""

    sessions: tuple[SessionStep, ...]

    @property
    def specs(self) -> list[SampleSpec]:
        return [s.spec for s in self.sessions]

    @property
    def tickets(self) -> list[Ticket]:
        return [s.ticket for s in self.sessions]


@dataclass(frozen=True)
class FirstTokens(SessionsInOrder):
    """The sampler call after a prefill call, for the prompts it finished (each checks
    at most one hidden draft). ``own_call``: the prefill ran in a call of its own, so
    its time counts as prefill time (not when it rode a step)."""

    sessions: tuple[SessionStep, ...]
    t0: float
    own_call: bool


@dataclass(frozen=True)
class StepPlan(SessionsInOrder):
    """One batched step: every running session once, in running order, with the tokens
    it feeds (C[-1] plus its drafts, cut to the verify width), and the prompt pieces
    that ride the same forward. ``t_start``: when planning began (the loop's own time
    is counted from it)."""

    sessions: tuple[SessionStep, ...]
    riding: tuple[Piece, ...]
    t_start: float

    @property
    def inputs(self) -> list[StepInput]:
        out = []
        for s in self.sessions:
            assert s.input is not None
            out.append(s.input)
        return out

    @property
    def tokens(self) -> int:
        """Tokens the sessions feed (the batch's ``num_tokens``)."""
        return sum(len(s.input.tokens) for s in self.sessions if s.input is not None)
