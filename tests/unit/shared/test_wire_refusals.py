"""The refused-call budget's bookkeeping (issue 38, red-team findings 2 and 5): a
connection is cut off after more than ``limit`` refusals within the window, stays so while
it keeps calling, and is forgotten once idle; the tracked connections are capped."""

from __future__ import annotations

import pytest

from eventspec.shared.wire.refusals import MAX_CUT_S, RefusalBudget, mark_refused


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cut_off_after_the_budget_and_not_before() -> None:
    clock = Clock()
    budget = RefusalBudget(limit=3, window_s=10.0, clock=clock)
    for _ in range(3):
        budget.refused("ipv4:10.0.0.1:1000")
        assert not budget.cut_for("ipv4:10.0.0.1:1000")
    budget.refused("ipv4:10.0.0.1:1000")
    assert budget.cut_for("ipv4:10.0.0.1:1000")
    assert not budget.cut_for("ipv4:10.0.0.1:1001")  # another connection of the same host
    assert budget.cut_connections == 1


def test_refusals_spread_over_windows_never_cut() -> None:
    clock = Clock()
    budget = RefusalBudget(limit=3, window_s=10.0, clock=clock)
    for _ in range(10):
        for _ in range(3):
            budget.refused("p")
        clock.now += 10.0
        assert not budget.cut_for("p")
    assert budget.cut_connections == 0


def test_a_cut_connection_stays_cut_while_it_calls_and_is_forgotten_when_idle() -> None:
    clock = Clock()
    budget = RefusalBudget(limit=1, window_s=10.0, clock=clock)
    budget.refused("p")
    budget.refused("p")
    for _ in range(5):  # 25 s of calls, each within the window of the last
        clock.now += 5.0
        assert budget.cut_for("p")
    clock.now += 10.0  # idle for a window
    assert not budget.cut_for("p")
    assert "p" not in budget.windows


def test_idle_connections_are_forgotten() -> None:
    clock = Clock()
    budget = RefusalBudget(limit=5, window_s=10.0, clock=clock)
    for i in range(100):
        budget.refused(f"ipv4:10.0.0.{i}:1")
    assert len(budget.windows) == 100
    clock.now += 10.0
    budget.refused("ipv4:10.0.1.1:1")
    assert list(budget.windows) == ["ipv4:10.0.1.1:1"]


def test_the_tracked_connections_are_capped() -> None:
    clock = Clock()
    budget = RefusalBudget(limit=5, window_s=10.0, max_tracked=8, clock=clock)
    for i in range(50):
        budget.refused(f"p{i}")
        clock.now += 0.01
    assert len(budget.windows) == 8
    assert list(budget.windows) == [f"p{i}" for i in range(42, 50)]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="refusal budget"):
        RefusalBudget(limit=0)
    with pytest.raises(ValueError, match="refusal budget"):
        RefusalBudget(window_s=0)


def test_marking_outside_a_call_is_a_no_op() -> None:
    mark_refused()


def test_a_cut_ends_after_max_cut_s_however_often_it_calls() -> None:
    clock = Clock()
    budget = RefusalBudget(limit=1, window_s=10.0, clock=clock)
    budget.refused("p")
    budget.refused("p")
    while clock.now < 100.0 + MAX_CUT_S - 1:
        assert budget.cut_for("p")
        clock.now += 1.0
    clock.now += 1.0
    assert not budget.cut_for("p")  # a new budget: its next refusal counts from one
    budget.refused("p")
    assert not budget.cut_for("p")
