"""The batch-aware cost model: the fit (cloud/calibrate.py) and its use
(shared/contract/timing.py)."""

from __future__ import annotations

import dataclasses

import pytest

from eventspec.cloud.calibrate import fit_step_cost
from eventspec.shared.contract import convert
from eventspec.shared.contract.timing import CloudCost

COST = CloudCost(prefill_base_ms=0.0, prefill_ms_per_visual_token=0.1,
                 prefill_ms_per_text_token=0.1, step_base_ms=20.0, step_ms_per_token=0.5,
                 step_ms_per_session=3.0)


def test_fit_recovers_base_session_and_token_terms() -> None:
    points = [(b, b * k, 20.0 + 3.0 * (b - 1) + 0.5 * b * k)
              for b in (1, 2, 4, 8) for k in (1, 4, 8)]
    base, per_session, per_token = fit_step_cost(points)
    assert base == pytest.approx(20.0) and per_session == pytest.approx(3.0)
    assert per_token == pytest.approx(0.5)


def test_fit_with_one_batch_size_has_no_session_term() -> None:
    base, per_session, per_token = fit_step_cost([(1, k, 10.0 + 2.0 * k) for k in (1, 4, 8)])
    assert (base, per_session) == (pytest.approx(10.0), 0.0)
    assert per_token == pytest.approx(2.0)


def test_a_loaded_cloud_steps_slower() -> None:
    alone = COST.step_ms(1)
    assert alone == pytest.approx(20.5)  # unchanged for one session
    loaded = dataclasses.replace(COST, load_sessions=16.0)
    assert loaded.step_ms(1) == pytest.approx(20.0 + 15 * 3.0 + 16 * 0.5)
    assert loaded.step_ms(9) > loaded.step_ms(1) > alone
    assert COST.batch_step_ms(4, 12) == pytest.approx(20.0 + 9.0 + 6.0)


def test_load_travels_on_the_wire_and_old_servers_mean_alone() -> None:
    loaded = dataclasses.replace(COST, load_sessions=4.0)
    assert convert.cloud_cost_from_pb(convert.cloud_cost_to_pb(loaded)) == loaded
    old = convert.cloud_cost_to_pb(COST)
    old.ClearField("load_sessions")
    old.ClearField("step_ms_per_session")
    from_old = convert.cloud_cost_from_pb(old)
    assert from_old.step_ms(3) == pytest.approx(20.0 + 1.5)
