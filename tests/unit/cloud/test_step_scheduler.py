"""The scheduler's plans and updates without an engine (issue 37): what ``schedule_*``
plans from the requests' state, and what ``update_*`` does with the sampler's verdicts.
The engine loop's side is played by ``tests.support.step_driver`` with a fake model."""

from __future__ import annotations

from eventspec.cloud.scheduling.sampler import Verdict
from eventspec.cloud.scheduling.tickets import Failure, Ticket
from eventspec.cloud.speculation.decoding import Committed
from eventspec.shared.contract.errors import Unavailable
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.types import FinishReason
from tests.support.fake_engine import EOS, next_token, target_only
from tests.support.step_driver import MAX_SEQ, Driver, greedy_verdict


def _prefilled(d: Driver, *prompts: tuple[int, ...], max_new: int = 20) -> list[Ticket]:
    """Requests admitted, submitted and through their prefill (each has C[0])."""
    tickets = []
    for prompt in prompts:
        ticket = d.admit(prompt, max_new)
        assert ticket is not None
        d.submit(ticket)
        tickets.append(ticket)
    d.take_commands()
    plan = d.sched.schedule_prefill()
    assert plan is not None and plan.tickets == tickets
    first = d.sched.first_tokens(plan.tickets, plan.t0)
    d.sched.update_prefill(first, d.verdicts(first.sessions))
    return tickets


def _long_prompt(n: int = 20) -> tuple[int, ...]:
    """A prompt whose target-only answer runs ``n`` tokens without EOS."""
    return next((3, s, 4) for s in range(3, 32) if len(target_only((3, s, 4), n, MAX_SEQ)) == n)


def test_a_step_plan_holds_every_running_session_once_with_its_drafts() -> None:
    d = Driver(num_slots=3)
    a, b = _prefilled(d, _long_prompt(), (5, 6, 7))
    truth = target_only(d.prompts[id(a)], 20, MAX_SEQ)
    d.offer(a, 1, truth[1:4])  # three right drafts after C[0]
    step = d.sched.schedule_step()
    assert step is not None and step.tickets == [a, b] == d.sched.running
    sa, sb = step.sessions
    assert sa.input is not None and sb.input is not None
    assert sa.input.tokens == (truth[0], *truth[1:4]) and sa.drafts == tuple(truth[1:4])
    assert sa.input.start_position == len(d.prompts[id(a)])  # C[0]'s position
    assert sa.spec.rows == 4 and sb.spec.rows == 1 and sb.drafts == ()
    assert step.tokens == 5 and step.riding == ()


def test_update_step_commits_the_verdicts_and_ends_a_finished_session() -> None:
    d = Driver(num_slots=2)
    a, b = _prefilled(d, _long_prompt(), (5, 6, 7))
    d.events.extend(d.sched.outbox.drain())
    step = d.sched.schedule_step()
    assert step is not None
    d.sched.update_step(step, [Verdict(0, [9]), Verdict(0, [EOS])], 2.5)
    events = dict((id(t), e) for t, e in d.sched.outbox.drain())
    ea, eb = events[id(a)], events[id(b)]
    assert isinstance(ea, Committed) and ea.tokens == (9,) and ea.finish_reason is None
    assert isinstance(eb, Committed) and eb.finish_reason == FinishReason.EOS
    assert d.sched.running == [a] and not b.slot_held and d.holder[b.slot] is None
    assert d.sched.last_step == (2, 2) and ea.step_ms == 2.5


def test_prefills_are_planned_first_come_first_served_within_the_budget() -> None:
    d = Driver(num_slots=6, budget=10)
    prompts = [(5, 6, 7), (8, 9, 10, 11), (12, 13, 14), (15, 16, 17), (18, 19, 20, 21)]
    tickets = [d.admit(p, 4) for p in prompts]
    for t in tickets:
        assert t is not None
        d.submit(t)
    d.take_commands()
    groups = []
    while (plan := d.sched.schedule_prefill()) is not None:
        groups.append(plan.tickets)
    assert groups == [tickets[:3], tickets[3:]]  # 3 + 4 + 3 = 10 tokens; then the rest


def test_a_prompt_longer_than_the_budget_is_planned_alone() -> None:
    d = Driver(num_slots=2, budget=2)
    t = d.admit((3, 4, 5, 6, 7), 3)
    assert t is not None
    d.submit(t)
    d.take_commands()
    plan = d.sched.schedule_prefill()
    assert plan is not None and plan.tickets == [t]


def test_a_released_or_cancelled_request_is_never_planned_and_its_slot_comes_back() -> None:
    d = Driver(num_slots=3)
    gone, cancelled, kept = (d.admit(p, 4) for p in [(5, 6), (7, 8), (9, 10)])
    assert gone is not None and cancelled is not None and kept is not None
    for t in (gone, cancelled, kept):
        d.submit(t)
    d.release(gone)
    d.cancel(cancelled)
    d.take_commands()
    plan = d.sched.schedule_prefill()
    assert plan is not None and plan.tickets == [kept]
    assert d.holder[gone.slot] is None and d.holder[cancelled.slot] is None
    [(ticket, event)] = d.sched.outbox.drain()  # the released stream hears nothing
    assert ticket is cancelled and isinstance(event, Committed)
    assert event.finish_reason == FinishReason.CANCELLED and d.sched.pool.free == 2


def test_a_cancelled_session_is_finished_when_the_step_is_planned() -> None:
    d = Driver(num_slots=2)
    a, b = _prefilled(d, _long_prompt(), (5, 6, 7))
    d.sched.outbox.drain()
    d.cancel(a)
    d.take_commands()
    step = d.sched.schedule_step()
    assert step is not None and step.tickets == [b]
    [(ticket, event)] = d.sched.outbox.drain()
    assert ticket is a and isinstance(event, Committed) and event.tokens == ()
    assert a.session.finish_reason == FinishReason.CANCELLED and not a.slot_held


def test_a_hidden_draft_is_checked_with_the_first_token() -> None:
    d = Driver(num_slots=1)
    prompt = _long_prompt()
    t = d.admit(prompt, 8)
    assert t is not None
    d.offer(t, 0, (next_token(prompt), 1, 2))  # drafted while the prefill ran
    d.submit(t)
    d.take_commands()
    plan = d.sched.schedule_prefill()
    assert plan is not None
    first = d.sched.first_tokens(plan.tickets, plan.t0)
    [s] = first.sessions
    assert s.drafts == (next_token(prompt),) and s.spec.rows == 1 and s.input is None
    d.sched.update_prefill(first, [greedy_verdict(prompt, [], s.drafts, 1)])
    assert t.session.committed == [next_token(prompt)] and d.sched.running == [t]


def test_verify_width_auto_trims_the_drafts_in_the_plan() -> None:
    """A cost model under which no second draft repays its time: one each."""
    prohibitive = CloudCost(50.0, 0.1, 0.1, 1.0, 50.0)
    d = Driver(num_slots=2, verify_cost=prohibitive)
    a, b = _prefilled(d, _long_prompt(), (5, 6, 7))
    for t in (a, b):
        d.offer(t, 1, (3, 4, 5, 6))
    step = d.sched.schedule_step()
    assert step is not None
    assert [len(s.drafts) for s in step.sessions] == [1, 1]
    assert [s.spec.rows for s in step.sessions] == [2, 2]


def test_pieces_ride_the_step_while_sessions_decode() -> None:
    d = Driver(num_slots=3, chunk=4, mixed=True)
    [old] = _prefilled(d, _long_prompt())
    new = d.admit(tuple(range(3, 13)), 4)  # ten prompt tokens: three pieces of <= 4
    assert new is not None
    d.submit(new)
    d.take_commands()
    plan = d.sched.schedule_prefill()
    assert plan is not None and plan.ride
    assert [(p.start, p.end) for p in plan.pieces] == [(0, 4)]
    step = d.sched.schedule_step(plan.pieces)
    assert step is not None and step.tickets == [old] and step.riding == plan.pieces
    assert d.sched.pieces_written(step.riding, step.t_start, own_call=False) == []
    d.sched.update_step(step, d.verdicts(step.sessions), 1.0)
    later = d.sched.schedule_prefill()
    assert later is not None and [(p.start, p.end) for p in later.pieces] == [(4, 8)]


def test_with_nothing_decoding_pieces_run_whole_in_a_call_of_their_own() -> None:
    d = Driver(num_slots=1, chunk=4, mixed=True)
    t = d.admit(tuple(range(3, 13)), 4)
    assert t is not None
    d.submit(t)
    d.take_commands()
    plan = d.sched.schedule_prefill()
    assert plan is not None and not plan.ride
    assert [(p.start, p.end) for p in plan.pieces] == [(0, 10)]


def test_a_failed_call_fails_its_requests_and_gives_their_slots_back() -> None:
    d = Driver(num_slots=2)
    a, b = _prefilled(d, _long_prompt(), (5, 6, 7))
    d.sched.outbox.drain()
    step = d.sched.schedule_step()
    assert step is not None
    d.sched.fail(step.tickets, Unavailable("the device fell over"))
    events = d.sched.outbox.drain()
    assert [t for t, _ in events] == [a, b]
    assert all(isinstance(e, Failure) for _, e in events)
    assert d.sched.running == [] and d.sched.pool.free == 2 and d.freed == 2


def test_shutting_down_fails_what_runs_and_what_waits() -> None:
    d = Driver(num_slots=3)
    [running] = _prefilled(d, _long_prompt())
    waiting = d.admit((5, 6), 4)
    queued = d.admit((7, 8), 4)
    assert waiting is not None and queued is not None
    d.submit(waiting)
    d.take_commands()
    d.submit(queued)  # its command is still on the way in
    d.sched.outbox.drain()
    d.sched.shut_down()
    failed = [t for t, e in d.sched.outbox.drain() if isinstance(e, Failure)]
    assert failed == [running, waiting, queued] and d.sched.pool.free == 3
