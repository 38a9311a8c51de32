"""Online estimators: EWMA, per-token acceptance, smoothed RTT."""

from __future__ import annotations

import pytest

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.estimators import AcceptanceEstimator, Ewma, RttEstimator


def test_ewma() -> None:
    e = Ewma(0.25, 10.0)
    assert e.value == 10.0 and e.count == 0
    assert e.update(18.0) == 12.0
    assert e.update(12.0) == 12.0
    for _ in range(100):
        e.update(4.0)
    assert e.value == pytest.approx(4.0) and e.count == 102
    with pytest.raises(InvalidInput, match="alpha_smoothing"):
        Ewma(0.0, 1.0)
    with pytest.raises(InvalidInput, match="alpha_smoothing"):
        Ewma(1.5, 1.0)
    with pytest.raises(InvalidInput, match="finite"):
        e.update(float("nan"))


def test_acceptance_estimator_counts_trials_not_drafts() -> None:
    est = AcceptanceEstimator(prior=0.5, smoothing=0.1)
    assert est.value == 0.5
    est.observe(accepted=3, verified=8)  # 3 successes, 1 failure; 4 unverified ignored
    assert est.trials == 4
    expected = 0.5
    for x in (1.0, 1.0, 1.0, 0.0):
        expected = 0.9 * expected + 0.1 * x
    assert est.value == pytest.approx(expected)
    est.observe(accepted=0, verified=0)  # nothing verified: no information
    assert est.trials == 4
    for _ in range(200):
        est.observe(accepted=4, verified=4)
    assert 0.99 < est.value <= 1.0
    with pytest.raises(InvalidInput, match="exceeds"):
        est.observe(accepted=3, verified=2)
    with pytest.raises(InvalidInput, match="prior"):
        AcceptanceEstimator(prior=1.2)


def test_acceptance_estimator_totals_need_rejection_count() -> None:
    per_step = AcceptanceEstimator(prior=0.5, smoothing=0.01)
    totals = AcceptanceEstimator(prior=0.5, smoothing=0.01)
    for _ in range(10):
        per_step.observe(accepted=1, verified=4)
    totals.observe(accepted=10, verified=40, rejections=10)
    assert totals.trials == per_step.trials == 20
    assert totals.value == pytest.approx(per_step.value, abs=1e-3)
    with pytest.raises(InvalidInput, match="rejections=0 but 30 drafts"):
        totals.observe(accepted=10, verified=40, rejections=0)
    with pytest.raises(InvalidInput, match="rejections=31 exceeds the 30 rejected drafts"):
        totals.observe(accepted=10, verified=40, rejections=31)


def test_rtt_estimator_like_tcp_srtt() -> None:
    est = RttEstimator()
    assert est.value == 0.0
    assert est.update(100.0) == 100.0 and est.rttvar == 50.0
    assert est.update(180.0) == pytest.approx(110.0)  # 7/8 * 100 + 1/8 * 180
    assert est.rttvar == pytest.approx(0.75 * 50.0 + 0.25 * 80.0)
    seeded = RttEstimator(initial_ms=40.0)
    assert seeded.value == 40.0 and seeded.update(40.0) == 40.0 and seeded.samples == 1
    with pytest.raises(InvalidInput, match="sample_ms"):
        est.update(-1.0)
    with pytest.raises(InvalidInput, match="smoothing"):
        RttEstimator(smoothing=0.0)


def test_ewma_without_initial_is_seeded_by_the_first_observation() -> None:
    e = Ewma(0.5, None)
    assert e.value == 0.0 and e.count == 0
    assert e.update(8.0) == 8.0
    assert e.update(4.0) == 6.0
