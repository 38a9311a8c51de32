"""The step-kind rule (``eventspec.cloud.scheduling.step_kinds``) over arbitrary plans:
any riding pieces (from one or several prompts, starting their tower or not, ending
their prompt or not) and any flags the loop passes give exactly the kind the rule's
order names, whatever the pieces' order."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.scheduling.prefill_queue import Pending, Piece
from eventspec.cloud.scheduling.step_kinds import StepKind, step_kind
from eventspec.cloud.scheduling.step_plan import StepPlan
from eventspec.cloud.scheduling.tickets import Ticket
from tests.support.scheduler_sessions import session_factory


@dataclass(frozen=True)
class Case:
    """A plan's riding pieces and the loop's flags."""

    pieces: tuple[Piece, ...]
    fixed_shape: bool | None
    prefilled: bool
    fell_back: bool

    def kind(self, pieces: tuple[Piece, ...] | None = None) -> StepKind:
        plan = StepPlan((), self.pieces if pieces is None else pieces, 0.0)
        return step_kind(plan, fixed_shape=self.fixed_shape, prefilled=self.prefilled,
                         fell_back=self.fell_back)


def _pending(slot: int, length: int) -> Pending:
    ticket = Ticket(f"r{slot}", session_factory(8, length, length + 8)(slot),
                    asyncio.Queue(), None)
    return Pending(ticket, PrefillRequest(slot, [1] * length))


@st.composite
def pieces(draw: st.DrawFn) -> tuple[Piece, ...]:
    """Up to 5 pieces of up to 4 prompts; a prompt may appear twice (the rule must
    count prompts, not pieces)."""
    prompts = [_pending(i, draw(st.integers(1, 600))) for i in range(draw(st.integers(1, 4)))]
    out = []
    for _ in range(draw(st.integers(0, 5))):
        p = draw(st.sampled_from(prompts))
        start = draw(st.integers(0, p.length - 1))
        end = draw(st.integers(start + 1, p.length))
        out.append(Piece(p, start, end, draw(st.booleans())))
    return tuple(out)


cases = st.builds(Case, pieces(), st.sampled_from([None, True, False]), st.booleans(),
                  st.booleans())


@given(cases)
def test_each_plan_gets_the_first_kind_of_the_rule_that_holds(case: Case) -> None:
    kind = case.kind()
    prompts = {id(p.pending) for p in case.pieces}
    if case.fell_back:
        assert kind is StepKind.FALLBACK
    elif case.prefilled:
        assert kind is StepKind.AFTER_PREFILL
    elif not case.pieces:
        assert kind is StepKind.PLAIN
    elif case.fixed_shape is False:
        assert kind is StepKind.EAGER
    elif any(p.tower for p in case.pieces):
        assert kind is StepKind.TOWER
    elif len(prompts) > 1:
        assert kind is StepKind.MULTI
    elif any(p.end == p.pending.length for p in case.pieces):
        assert kind is StepKind.FINISHING
    else:
        assert kind is StepKind.PIECE


@given(cases, st.randoms(use_true_random=False))
def test_the_kind_does_not_depend_on_the_pieces_order(case: Case, rng: random.Random) -> None:
    shuffled = list(case.pieces)
    rng.shuffle(shuffled)
    assert case.kind(tuple(shuffled)) is case.kind()


@given(cases)
def test_plain_means_no_prompt_work_and_a_tower_always_shows(case: Case) -> None:
    """Only a step with no pieces and no prefill call or failure is plain; a riding
    tower is never hidden by the pieces' count or their ends, only by the kinds before
    it (fallback, after_prefill, eager)."""
    kind = case.kind()
    no_work = not case.pieces and not case.prefilled and not case.fell_back
    assert (kind is StepKind.PLAIN) == no_work
    flagged = case.fell_back or case.prefilled or (case.pieces and case.fixed_shape is False)
    if any(p.tower for p in case.pieces) and not flagged:
        assert kind is StepKind.TOWER


def test_the_kinds_are_a_small_fixed_set_of_metric_labels() -> None:
    assert [str(k) for k in StepKind] == ["fallback", "after_prefill", "eager", "tower",
                                          "multi", "finishing", "piece", "plain"]
