"""Re-planning while a request decodes (cloud/requests/replanning.py): when it re-runs the plan,
on what, and that it only sends a plan the edge would act on differently."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.cloud.requests.replanning import EVERY_TOKENS, MIN_TRIALS, Replanner
from eventspec.shared.contract.timing import CloudCost, EdgeCost, PlanInputs, TimingPlan
from eventspec.shared.contract.timing_model import plan

#: H200-like: a 14 ms step alone, 0.23 ms a session more, 0.15 ms a token verified.
CLOUD = CloudCost(prefill_base_ms=20.0, prefill_ms_per_visual_token=0.02,
                  prefill_ms_per_text_token=0.02, step_base_ms=14.0, step_ms_per_token=0.15,
                  step_ms_per_session=0.23)
EDGE = EdgeCost(draft_prefill_ms=45.0, draft_ms_per_token=3.4, rtt_ms=20.0,
                uplink_bytes_per_s=0.0, acceptance_prior=0.8)
INPUTS = PlanInputs(cloud=CLOUD, edge=EDGE, visual_tokens=2048, text_tokens=40, alpha=0.8,
                    max_new_tokens=512, max_lookahead=15)


def _acts(p: TimingPlan) -> tuple[bool, int, int]:
    return p.speculate, p.lookahead_tokens, p.chunk_cadence_tokens


def _opened(load: float = 1.0, inputs: PlanInputs = INPUTS) -> Replanner:
    inputs = dataclasses.replace(inputs, cloud=dataclasses.replace(inputs.cloud,
                                                                   load_sessions=load))
    return Replanner(dataclasses.replace(plan(inputs), max_new_tokens=inputs.max_new_tokens),
                     inputs)


def test_a_steady_request_is_not_replanned() -> None:
    r = _opened()
    assert all(r.after_commit(n, 1, int(0.8 * n), n, n // 5) is None for n in range(1, 400))
    assert r.sent == 0


def test_a_load_jump_replans_at_once_for_the_load_now() -> None:
    r = _opened(load=1)
    fresh = r.after_commit(2, 64, 0, 0, 0)  # two tokens in, 64 sessions stepping now
    at_64 = plan(dataclasses.replace(
        INPUTS, cloud=dataclasses.replace(CLOUD, load_sessions=64.0), max_new_tokens=510,
        visual_tokens=0, text_tokens=0, max_hidden_drafts=0))
    assert _acts(plan(INPUTS)) != _acts(at_64), "the test needs a load that matters"
    assert fresh is not None and _acts(fresh) == _acts(at_64)
    assert fresh.hidden_draft_budget == 0 and fresh.max_new_tokens == 512
    assert r.sent == 1
    assert r.after_commit(3, 64, 0, 0, 0) is None  # nothing new: not sent twice


def test_drafts_that_keep_failing_shorten_the_lookahead() -> None:
    r = _opened()
    assert r.last.speculate
    assert r.after_commit(EVERY_TOKENS - 1, 1, 0, 40, 40) is None  # not yet due
    fresh = r.after_commit(EVERY_TOKENS, 1, 0, 40, 40)  # 0 of 40 verified drafts accepted
    assert fresh is not None and fresh.lookahead_tokens < r.inputs.max_lookahead
    assert 0 < fresh.lookahead_tokens < plan(INPUTS).lookahead_tokens


def test_failing_drafts_where_verify_rows_cost_turn_speculation_off() -> None:
    """A verified token costing 1.5 ms (a loaded cloud's wide rows): at the observed
    acceptance speculation no longer pays, and the edge is told to stop."""
    costly = dataclasses.replace(INPUTS, cloud=dataclasses.replace(CLOUD, step_ms_per_token=1.5))
    r = _opened(inputs=costly)
    assert r.last.speculate
    off = r.after_commit(EVERY_TOKENS, 1, 0, 40, 40)
    assert off is not None and not off.speculate and off.lookahead_tokens == 0


def test_too_few_trials_keep_the_prior() -> None:
    r = _opened()
    assert r.after_commit(EVERY_TOKENS, 1, 0, MIN_TRIALS - 1, MIN_TRIALS - 1) is None


def test_no_replan_near_the_end() -> None:
    r = _opened(load=1)
    assert r.after_commit(512 - EVERY_TOKENS, 64, 0, 0, 0) is None


def test_a_profile_with_no_fixed_prefill_cost_replans() -> None:
    """GPU profiles fit the prefill as per-token costs alone (prefill_base_ms 0): the
    re-plan must still be a valid plan (it once priced a prompt of 0 tokens, which
    PlanInputs refuses, and the request failed INVALID_ARGUMENT mid-answer)."""
    gpu_like = dataclasses.replace(INPUTS, cloud=dataclasses.replace(CLOUD, prefill_base_ms=0.0))
    r = _opened(inputs=gpu_like)
    assert r.after_commit(2, 64, 0, 0, 0) is not None


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 80), st.integers(0, 6),
                                st.floats(0.0, 1.0)), min_size=1, max_size=80),
       load=st.integers(1, 64))
def test_every_plan_sent_changes_what_the_edge_does(
        steps: list[tuple[int, int, int, float]], load: int) -> None:
    """Whatever the loads and verdicts, a plan is sent only when it changes the edge's
    actions, never with hidden drafts, always with the request's token cap."""
    r = _opened(load=load)
    committed = accepted = verified = rejections = 0
    last = _acts(r.last)
    for tokens, live, checked, share in steps:
        committed += tokens
        ok = int(checked * share)
        verified, accepted, rejections = verified + checked, accepted + ok, rejections + (
            ok < checked)
        fresh = r.after_commit(committed, live, accepted, verified, rejections)
        if fresh is not None:
            assert _acts(fresh) != last
            assert fresh.hidden_draft_budget == 0 and fresh.max_new_tokens == 512
            last = _acts(fresh)
