"""The verify-width rule: per session, the drafts a batched step verifies maximise the
step's expected committed tokens per ms under the linear cost model."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.verify_width import SessionDrafts, verify_widths
from eventspec.shared.node.static.buckets import TOKEN_BUCKETS, bucket


def _cost(per_token: float, per_session: float = 0.5, base: float = 5.0) -> CloudCost:
    return CloudCost(50.0, 0.1, 0.1, base, per_token, step_ms_per_session=per_session)


def _expected(sessions: list[SessionDrafts], widths: list[int]) -> float:
    return sum(sum(s.alpha ** j for j in range(k + 1))
               for s, k in zip(sessions, widths, strict=True))


def _rate(cost: CloudCost, sessions: list[SessionDrafts], widths: list[int]) -> float:
    tokens = sum(k + 1 for k in widths)
    return _expected(sessions, widths) / cost.batch_step_ms(len(sessions), tokens)


Rate = Callable[[CloudCost, list[SessionDrafts], list[int]], float]


def _assert_best_of_every_choice(cost: CloudCost, sessions: list[SessionDrafts],
                                 widths: list[int], rate: Rate) -> None:
    """Widths within what is offered (>= 1 where drafts are), and no other such choice
    with a higher ``rate``."""
    assert all((s.available == 0 and k == 0) or 1 <= k <= s.available
               for s, k in zip(sessions, widths, strict=True))
    best = rate(cost, sessions, widths)
    ranges = [range(1 if s.available else 0, s.available + 1) for s in sessions]
    for other in itertools.product(*ranges):
        assert rate(cost, sessions, list(other)) <= best * (1 + 1e-9), (other, widths)


sessions_st = st.lists(st.builds(SessionDrafts, available=st.integers(0, 5),
                                 alpha=st.floats(0.0, 1.0)), min_size=1, max_size=3)


@settings(max_examples=150, deadline=None)
@given(sessions=sessions_st, per_token=st.sampled_from([0.0, 0.01, 0.3, 2.0, 50.0]))
def test_the_widths_are_the_best_of_every_choice(sessions: list[SessionDrafts],
                                                  per_token: float) -> None:
    """Exhaustive check on small batches: no other choice (>= 1 where drafts are
    offered) has a higher expected rate."""
    cost = _cost(per_token)
    _assert_best_of_every_choice(cost, sessions, verify_widths(cost, sessions), _rate)


def test_free_verification_takes_every_draft_and_dear_takes_one() -> None:
    offers = [SessionDrafts(8, 0.8), SessionDrafts(3, 0.5), SessionDrafts(0, 0.9)]
    assert verify_widths(_cost(0.0), offers) == [8, 3, 0]
    assert verify_widths(_cost(100.0), offers) == [1, 1, 0]


def test_a_loaded_batch_verifies_fewer_drafts_than_a_lone_session() -> None:
    """The same per-token cost weighs more against a step that commits few tokens per
    ms: alone, a session's drafts are worth more of the step than in a batch of 64."""
    cost = _cost(0.15, per_session=0.25, base=5.0)
    alone = verify_widths(cost, [SessionDrafts(16, 0.8)])[0]
    loaded = verify_widths(cost, [SessionDrafts(16, 0.8)] * 64)[0]
    assert alone > loaded >= 1


@settings(max_examples=60, deadline=None)
@given(available=st.integers(1, 12), a=st.floats(0.0, 0.99), b=st.floats(0.0, 0.99))
def test_more_acceptance_never_verifies_fewer(available: int, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    cost = _cost(0.3)
    assert (verify_widths(cost, [SessionDrafts(available, lo)])[0]
            <= verify_widths(cost, [SessionDrafts(available, hi)])[0])


def test_bad_offers_name_the_field() -> None:
    with pytest.raises(InvalidInput, match="available"):
        SessionDrafts(-1, 0.5)
    with pytest.raises(InvalidInput, match="alpha"):
        SessionDrafts(1, 1.5)


def _bucketed(q: int) -> int:
    """The static engine's padding with its graph buckets (``padded_tokens``)."""
    return bucket(q, TOKEN_BUCKETS) or q


def _padded_rate(cost: CloudCost, sessions: list[SessionDrafts], widths: list[int]) -> float:
    rows = _bucketed(max(k + 1 for k in widths))
    return _expected(sessions, widths) / cost.batch_step_ms(len(sessions), len(sessions) * rows)


@settings(max_examples=150, deadline=None)
@given(sessions=sessions_st, per_token=st.sampled_from([0.0, 0.01, 0.3, 2.0, 50.0]))
def test_on_a_padded_engine_the_widths_are_the_best_of_every_choice(
        sessions: list[SessionDrafts], per_token: float) -> None:
    """Every session pays the rows of the longest (bucketed, as the static engine's
    graphs): exhaustively, no other choice has a higher expected rate under that cost."""
    cost = _cost(per_token)
    widths = verify_widths(cost, sessions, pad=_bucketed)
    _assert_best_of_every_choice(cost, sessions, widths, _padded_rate)


def test_one_long_offer_does_not_pad_a_loaded_batch() -> None:
    """Fifteen sessions with one draft and one with sixteen: the linear rule gives the
    long one several drafts, which pads all sixteen to its rows; the padded rule sees
    that the step then costs every session those rows, and keeps the short shape."""
    cost = _cost(0.3, per_session=0.37, base=6.4)
    offers = [SessionDrafts(1, 0.6)] * 15 + [SessionDrafts(16, 0.6)]
    linear = verify_widths(cost, offers)
    padded = verify_widths(cost, offers, pad=_bucketed)
    assert max(linear) > 1 and max(padded) == 1
    assert _padded_rate(cost, offers, padded) > _padded_rate(cost, offers, linear)
