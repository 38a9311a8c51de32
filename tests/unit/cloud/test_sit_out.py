"""``--sit-out``: which dry sessions wait a step, and that waiting changes no answer.

The policy alone (:class:`SitOut`), then the scheduler with it: a loaded batch where one
session's drafts run out after a rejection sits that session out once, not twice, and
every answer is still target-only's (the property test in
``test_step_scheduler_property.py`` covers any sequence of requests with it on).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspec.cloud.config import CloudSettings
from eventspec.cloud.speculation.sit_out import AUTO_MIN_SESSIONS, DryState, SitOut
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.node_cli import SettingsError
from tests.support.fake_engine import target_only
from tests.support.step_driver import MAX_SEQ, Driver

DRY = DryState(dry=True, speculative=True, sat_out_last=False, drafted_last=True)


def test_the_flag_parses_off_auto_and_a_session_count() -> None:
    assert SitOut.parse("off") == SitOut(0) and not SitOut.parse("off").enabled
    assert SitOut.parse("auto") == SitOut(AUTO_MIN_SESSIONS)
    assert SitOut.parse("5") == SitOut(5)
    for bad in ("1", "0", "-3", "yes", ""):
        with pytest.raises(InvalidInput, match="--sit-out"):
            SitOut.parse(bad)


def test_a_bad_value_stops_the_cloud_at_start_up_naming_the_flag() -> None:
    with pytest.raises(SettingsError, match="--sit-out"):
        CloudSettings(sit_out="sometimes").check()
    CloudSettings().check()  # the default parses


def test_only_a_speculating_dry_session_whose_drafts_are_coming_sits_out() -> None:
    policy = SitOut(2)
    others = DryState(dry=False, speculative=True, sat_out_last=False, drafted_last=True)
    cases = {
        DRY: True,
        DRY._replace(dry=False): False,
        DRY._replace(speculative=False): False,  # target-only: no drafts will come
        DRY._replace(sat_out_last=True): False,  # at most one step out in a row
        DRY._replace(drafted_last=False): False,  # its edge is not drafting
    }
    for state, sits in cases.items():
        assert policy.choose([state, others]) == [sits, False], state


def test_below_the_load_threshold_nobody_sits_out() -> None:
    assert SitOut(4).choose([DRY] + [DRY._replace(dry=False)] * 2) == [False] * 3
    assert SitOut(4).choose([DRY] + [DRY._replace(dry=False)] * 3) == [True] + [False] * 3
    assert SitOut(0).choose([DRY] * 20) == [False] * 20


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
                min_size=0, max_size=24), st.integers(2, 10))
def test_never_every_session_and_only_dry_ones(flags: list[tuple[bool, bool, bool, bool]],
                                               min_sessions: int) -> None:
    states = [DryState(*f) for f in flags]
    sit = SitOut(min_sessions).choose(states)
    assert len(sit) == len(states)
    assert not states or not all(sit)
    assert all(s.dry and s.speculative and not s.sat_out_last
               for s, x in zip(states, sit, strict=True) if x)
    if len(states) < min_sessions:
        assert not any(sit)


def _run(sit_out: SitOut, wrong_at: int) -> tuple[Driver, list[list[int]]]:
    """Three sessions; session 0 is offered drafts whose token ``wrong_at`` is wrong, so
    it is dry on the step after its rejection; the other two are offered right drafts
    for their whole answers. Returns the driver and each session's answer."""
    d = Driver(3, sit_out=sit_out)
    prompts = [(5, 6, 7), (8, 9), (10, 11, 12, 13)]
    max_new = 12
    tickets = [d.admit(p, max_new) for p in prompts]
    assert all(t is not None for t in tickets)
    truths = [target_only(p, max_new, MAX_SEQ) for p in prompts]
    for t in tickets:
        assert t is not None
        d.submit(t)
    d.take_commands()
    d.iterate()  # the prefills: each has its first token
    for i, t in enumerate(tickets):
        assert t is not None
        drafts = list(truths[i][1:])
        if i == 0:
            drafts[wrong_at] = (drafts[wrong_at] + 1) % 50
            drafts = drafts[: wrong_at + 1]
        d.offer(t, 1, drafts)
    received: list[list[int]] = [[] for _ in tickets]
    seen = 0
    for _ in range(4 * MAX_SEQ):
        d.take_commands()
        d.iterate()
        for ticket, event in d.events[seen:]:
            i = next(j for j, t in enumerate(tickets) if t is ticket)
            received[i].extend(getattr(event, "tokens", ()))
        seen = len(d.events)
        if d.sched.idle:
            break
    return d, received


def test_a_dry_session_sits_one_step_out_and_the_answers_do_not_change() -> None:
    on, answers_on = _run(SitOut(2), wrong_at=2)
    off, answers_off = _run(SitOut(0), wrong_at=2)
    assert answers_on == answers_off
    assert answers_on[0] == target_only((5, 6, 7), 12, MAX_SEQ)
    assert off.sat_out == 0
    # Session 0 ran dry after its rejection: one step out, then it stepped alone-style
    # (one token a step, its edge silent), never out again.
    assert on.sat_out == 1
