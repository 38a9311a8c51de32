"""Calibration does not trust nonsense: fits with negative slopes or far-off points are
re-measured, the load average is recorded, a reused profile is spot-checked against real
steps, and --recalibrate forces a fresh measurement (issue: a profile measured on a
loaded machine made a fresh cloud plan with a 260 ms step that really took 3-11 ms)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from cloud import calibrate
from cloud.cli import build_parser, settings_from_args
from cloud.engine.hf import HFEngine
from cloud.server import VerifierServer
from cloud.target import TargetModel
from shared.demoworld.tiny_target import build_tiny_random_target
from shared.profile import CalibrationProfile, load_profile, save_profile
from shared.timing import CloudCost

POINTS = [(b, b * k, 5.0 + 0.5 * (b - 1) + 0.1 * b * k) for b in (1, 2, 4) for k in (1, 4, 8)]


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


def cost(step_base_ms: float) -> CloudCost:
    return CloudCost(0.0, 0.01, 0.01, step_base_ms, 0.01, device="test")


def test_a_physical_fit_has_no_problems() -> None:
    fit = calibrate.fit_step_cost(POINTS)
    assert calibrate.fit_problems(fit, POINTS) == []


def test_negative_slopes_and_outliers_are_problems() -> None:
    assert any("per-token slope" in p for p in calibrate.fit_problems((260.0, 0.0, -18.6), POINTS))
    noisy = [*POINTS[:-1], (4, 32, 400.0)]  # one step taken while the machine was busy
    problems = calibrate.fit_problems(calibrate.fit_step_cost(noisy), noisy)
    assert any("measured" in p for p in problems)


def test_a_nonsense_round_is_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    rounds = iter([
        (cost(260.0), {"load_avg_1m": [7.0]}, ["per-token slope -18.6 ms < 0"]),
        (cost(5.0), {"load_avg_1m": [0.3]}, []),
    ])
    calls: list[int] = []

    def once(*_: object, **__: object) -> object:
        calls.append(1)
        return next(rounds)

    monkeypatch.setattr(calibrate, "_measure_once", once)
    got, samples = calibrate.measure_cloud_cost(None, None)  # type: ignore[arg-type]
    assert len(calls) == 2 and got.step_base_ms == 5.0 and samples["load_avg_1m"] == [0.3]


def test_measuring_records_the_load_average(target: TargetModel) -> None:
    _, samples, _ = calibrate._measure_once(target, HFEngine(target, num_slots=16), repeats=1)
    assert len(samples["load_avg_1m"]) == 1


def _write(path: Path, target: TargetModel, cloud: CloudCost) -> None:
    save_profile(path, CalibrationProfile(
        role="cloud", model_id=target.model_id, device=calibrate._device_name(target),
        created_unix=time.time(), cloud=cloud, edge=None))


def test_a_stale_profile_is_measured_again(
    target: TargetModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cloud.msgpack"
    _write(path, target, cost(260.0))  # far slower than a tiny model's real step
    fresh = cost(0.5)
    monkeypatch.setattr(calibrate, "measure_cloud_cost",
                        lambda *a, **k: (fresh, {"load_avg_1m": [0.1]}))
    got = calibrate.load_or_calibrate(target, HFEngine(target, num_slots=2), path)
    assert got == fresh
    saved = load_profile(path, expected_role="cloud", expected_model_id=target.model_id,
                         expected_device=calibrate._device_name(target))
    assert saved.cloud == fresh


def test_a_profile_that_matches_reality_is_reused(
    target: TargetModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = HFEngine(target, num_slots=2)
    assert calibrate.spot_check(target, engine, cost(1.0)) > 0
    path = tmp_path / "cloud.msgpack"
    _write(path, target, cost(3.0))
    # Within the spot check's factor of 2 (patched: real timings are not for unit tests).
    monkeypatch.setattr(calibrate, "spot_check", lambda *a: 1.4)

    def fail(*_: object, **__: object) -> object:
        raise AssertionError("should not re-measure")

    monkeypatch.setattr(calibrate, "measure_cloud_cost", fail)
    got = calibrate.load_or_calibrate(target, engine, path)
    assert got.step_base_ms == 3.0


def test_recalibrate_forces_a_fresh_measurement(
    target: TargetModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cloud.msgpack"
    _write(path, target, cost(1.0))
    fresh = cost(2.0)
    monkeypatch.setattr(calibrate, "measure_cloud_cost",
                        lambda *a, **k: (fresh, {"load_avg_1m": [0.1]}))
    assert calibrate.load_or_calibrate(target, HFEngine(target, num_slots=2), path,
                                       recalibrate=True) == fresh


@pytest.mark.parametrize("recalibrate", [False, True], ids=["profile", "recalibrate"])
async def test_serve_flags_reach_calibration_and_the_log_names_the_cost_model(
    target: TargetModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, recalibrate: bool,
) -> None:
    """``serve --profile P [--recalibrate]`` through the real parser and server: the
    profile is used (spot check passed) or re-measured, and the start-up log states the
    cost model the server then plans with."""
    path = tmp_path / "cloud.msgpack"
    _write(path, target, cost(3.0))
    monkeypatch.setattr(calibrate, "spot_check", lambda *a: 1.0)
    monkeypatch.setattr(calibrate, "measure_cloud_cost",
                        lambda *a, **k: (cost(7.0), {"load_avg_1m": [0.1]}))
    args = build_parser().parse_args(["serve", "--port", "0", "--profile", str(path),
                                      *(["--recalibrate"] if recalibrate else [])])
    server = VerifierServer(settings_from_args(args), target=target)
    caplog.set_level(logging.INFO, logger="cloud")
    await server.start()
    try:
        planned = server.runtime.info.cloud_cost.step_base_ms
    finally:
        await server.stop(0)
    expected = 7.0 if recalibrate else 3.0
    assert planned == expected
    (line,) = [r.getMessage() for r in caplog.records if "verifier SERVING" in r.getMessage()]
    assert f"planning with prefill 1.6 ms, step {expected:.1f} ms" in line, line
    measuring = any("calibrating the cost model" in r.getMessage() for r in caplog.records)
    assert measuring == recalibrate
