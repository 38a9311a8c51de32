"""Calibration does not trust nonsense: fits with negative slopes or far-off points are
re-measured, the load average is recorded, a reused profile is spot-checked against real
steps, and --recalibrate forces a fresh measurement (issue: a profile measured on a
loaded machine made a fresh cloud plan with a 260 ms step that really took 3-11 ms)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path

import pytest
from grpc import aio
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.cloud import calibrate
from eventspec.cloud.cli import build_parser, settings_from_args
from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.paced import PacedEngine
from eventspec.cloud.server import VerifierServer, build_runtime
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.profile import CalibrationProfile, load_profile, save_profile
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
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


def _write(path: Path, target: TargetModel, cloud: CloudCost, kernels: str = "") -> None:
    device = calibrate._device_name(target) + (f":{kernels}" if kernels else "")
    save_profile(path, CalibrationProfile(
        role="cloud", model_id=target.model_id, device=device,
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


def test_a_profile_of_other_kernels_is_measured_again(
    target: TargetModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same --profile file under --batch-invariant: its one-session spot check
    would pass (patched to), but the kernels differ, so it is measured again."""
    path = tmp_path / "cloud.msgpack"
    engine = HFEngine(target, num_slots=2)
    first = cost(1.0)
    monkeypatch.setattr(calibrate, "spot_check", lambda *a: 1.0)
    monkeypatch.setattr(calibrate, "measure_cloud_cost",
                        lambda *a, **k: (first, {"load_avg_1m": [0.1]}))
    assert calibrate.load_or_calibrate(target, engine, path, kernels="static") == first
    fresh = cost(2.0)
    monkeypatch.setattr(calibrate, "measure_cloud_cost",
                        lambda *a, **k: (fresh, {"load_avg_1m": [0.1]}))
    assert calibrate.load_or_calibrate(target, engine, path, kernels="static") == replace(
        first, calibration=f"profile file {path.name}")
    assert calibrate.load_or_calibrate(target, engine, path,
                                       kernels="static-invariant") == fresh


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
    monkeypatch.setattr(calibrate, "spot_check", lambda *a: 1.0)
    monkeypatch.setattr(calibrate, "measure_cloud_cost",
                        lambda *a, **k: (cost(7.0), {"load_avg_1m": [0.1]}))
    args = build_parser().parse_args(["serve", "--port", "0", "--profile", str(path),
                                      *(["--recalibrate"] if recalibrate else [])])
    settings = settings_from_args(args)
    _write(path, target, cost(3.0), kernels=settings.kernels)
    server = VerifierServer(settings, target=target)
    caplog.set_level(logging.INFO, logger="eventspec.cloud")
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


# -- issue 18: a calibration you can trust ---------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 16), st.integers(1, 256),
                          st.floats(0.01, 1e4, allow_nan=False)), min_size=1, max_size=30))
def test_the_step_fit_never_has_a_negative_coefficient(
    points: list[tuple[int, int, float]],
) -> None:
    """Whatever a busy machine measures, costs stay >= 0 (the clamped unconstrained fit
    once turned a negative slope into a 538 ms intercept)."""
    fit = calibrate.fit_step_cost(points)
    assert all(c >= 0 for c in fit), fit


def test_the_step_fit_recovers_exact_costs() -> None:
    base, per_session, per_token = calibrate.fit_step_cost(POINTS)
    assert (base, per_session, per_token) == pytest.approx((5.0, 0.5, 0.1), abs=1e-9)


def test_one_busy_point_is_set_aside_and_the_round_passes() -> None:
    noisy = [*POINTS[:-1], (4, 32, 400.0)]  # one step taken while the machine was busy
    fit, problems, outliers = calibrate.robust_step_fit(noisy)
    assert problems == [] and outliers == 1
    assert fit == pytest.approx((5.0, 0.5, 0.1), abs=1e-6)


def test_too_many_busy_points_fail_the_round() -> None:
    noisy = [(b, n, ms * (30.0 if i % 2 else 1.0)) for i, (b, n, ms) in enumerate(POINTS)]
    _, problems, outliers = calibrate.robust_step_fit(noisy)
    assert problems and outliers == int(calibrate.MAX_OUTLIER_FRACTION * len(noisy))


def _failing_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every measuring round fails its sanity check (as on the busy machine)."""

    def once(*_: object, progress: calibrate.Progress, **__: object) -> object:
        progress("steps of 4 session(s) (3 of 5 batch sizes)")
        return cost(538.5), {"load_avg_1m": [9.0]}, ["B=1, N=1: measured 67.87 ms, fit 789.97 ms"]

    monkeypatch.setattr(calibrate, "_measure_once", once)


def test_a_fit_that_never_passes_is_labelled_unreliable_and_reports_every_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _failing_rounds(monkeypatch)
    heard: list[str] = []
    got, _ = calibrate.measure_cloud_cost(None, None, progress=heard.append)  # type: ignore[arg-type]
    assert got.unreliable and got.calibration.startswith("unreliable, this run only")
    assert "measured 67.87 ms" in got.calibration and "load average 9.0" in got.calibration
    assert heard == [f"calibrating, round {r} of 3: steps of 4 session(s) (3 of 5 batch sizes)"
                     for r in (1, 2, 3)]


def test_an_unreliable_fit_is_used_for_this_run_but_never_saved(
    target: TargetModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _failing_rounds(monkeypatch)
    path = tmp_path / "cloud.msgpack"
    got = calibrate.load_or_calibrate(target, HFEngine(target, num_slots=2), path)
    assert got.unreliable and got.step_base_ms == 538.5
    assert not path.exists(), "an unreliable calibration was saved as good"


async def test_get_server_info_labels_an_unreliable_calibration(
    target: TargetModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """The label travels: GetServerInfo (what the edge plans with) says it is unreliable."""
    _failing_rounds(monkeypatch)
    args = build_parser().parse_args(["serve", "--port", "0", "--profile",
                                      str(tmp_path / "p.msgpack")])
    server = VerifierServer(settings_from_args(args), target=target)
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            info = await verifier_pb2_grpc.VerifierStub(channel).GetServerInfo(
                verifier_pb2.GetServerInfoRequest(), timeout=10)
    finally:
        await server.stop(0)
    assert info.profile.unreliable
    assert info.profile.calibration.startswith("unreliable, this run only")


def test_a_paced_engine_plans_with_its_known_costs_without_measuring(
    target: TargetModel, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The demo's paced cloud (200 ms / 30 ms by construction) planned with a measured
    9.1 ms step and never drafted; now it plans with what it is paced to."""

    def fail(*_: object, **__: object) -> object:
        raise AssertionError("a paced engine must not be calibrated")

    monkeypatch.setattr(calibrate, "measure_cloud_cost", fail)
    args = build_parser().parse_args(["serve", "--port", "0", "--emulate-prefill-ms", "200",
                                      "--emulate-step-ms", "30"])
    runtime = build_runtime(settings_from_args(args), target)
    got = runtime.info.cloud_cost
    assert got.prefill_ms(100, 20) == pytest.approx(200.0)
    assert got.batch_step_ms(1, 1) == pytest.approx(30.0)
    assert got.calibration.startswith("paced engine, known costs") and not got.unreliable


def test_a_paced_step_grows_with_sessions_and_drafts_like_the_gpu_engine(
    target: TargetModel,
) -> None:
    """Not flat: every (B, k) step of the H200 static engine, as a multiple of its
    single-token step, is matched by the paced floors within 15% on the run they were
    fitted to, and within 20% on the latest (B = 64 with 8 drafts each costs 6x one
    token there, not 1x)."""
    paced = PacedEngine(HFEngine(target, num_slots=2), prefill_ms=200, step_ms=30)
    one = paced.step_floor_ms(1, 1)
    assert one == pytest.approx(30.0)
    for name, rel in (("engine_h200_run6.json", 0.15), ("engine_h200.json", 0.20)):
        steps = json.loads((RESULTS / name).read_text())["steps"]
        one_gpu = next(s["ms"] for s in steps if s["B"] == 1 and s["k"] == 0)
        for s in steps:
            b, n = s["B"], s["B"] * (s["k"] + 1)
            ratio = s["ms"] / one_gpu
            assert paced.step_floor_ms(b, n) / one == pytest.approx(ratio, rel=rel), (name, s)
