"""Warm-up calibration of the cloud's cost model, persisted as a profile file.

Times real prefills and batched verify steps of the loaded engine on dummy inputs and
fits the linear cost model that ``shared.timing`` uses: prefill = per-visual-token *
visual + per-text-token * text, and a step over B sessions feeding N tokens = base +
per-session * (B - 1) + per-token * N (least squares over a small grid of B and tokens
per session). The result is saved with the model identity and device, and reused at the
next start if they match.

Timings taken on a busy machine can be nonsense (a negative slope clamped to 0 with a
huge intercept once made a fresh cloud believe a 3-11 ms step cost 260 ms). So a fit is
checked before it is trusted (no negative slopes, no point far from the fit) and
re-measured when it fails; the machine's load average is recorded with the samples; and
a reused profile is spot-checked against a few real steps and re-measured when it is off
by more than 2x. ``--recalibrate`` forces a fresh measurement.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from cloud.engine.base import BatchedEngine, PrefillRequest, StepBatch
from cloud.target import TargetModel
from shared.errors import EventSpecError
from shared.profile import CalibrationProfile, load_profile, save_profile
from shared.timing import CloudCost

log = logging.getLogger(__name__)

STEP_WIDTHS = (1, 4, 8, 16)
BATCH_SIZES = (1, 2, 4, 8, 16)
#: A fit may miss a measured point by at most this fraction of it.
MAX_RELATIVE_RESIDUAL = 0.5
#: Measuring rounds before the best (least bad) fit is taken with a warning.
MAX_ATTEMPTS = 3
#: A reused profile whose one-token step is off by more than this factor is re-measured.
SPOT_CHECK_FACTOR = 2.0


def fit_problems(
    fit: tuple[float, float, float], points: list[tuple[int, int, float]]
) -> list[str]:
    """Why a step-cost fit makes no physical sense (empty when it does): a negative
    slope or intercept, or a measured point far from the fitted line."""
    base, per_session, per_token = fit
    problems = [f"{name} {value:.3g} ms < 0" for name, value in
                (("base", base), ("per-session slope", per_session),
                 ("per-token slope", per_token)) if value < -1e-6]
    for b, n, ms in points:
        predicted = base + per_session * (b - 1) + per_token * n
        if ms > 0 and abs(predicted - ms) > MAX_RELATIVE_RESIDUAL * ms:
            problems.append(f"B={b}, N={n}: measured {ms:.2f} ms, fit {predicted:.2f} ms")
    return problems


def measure_cloud_cost(
    target: TargetModel, engine: BatchedEngine, *, repeats: int = 3
) -> tuple[CloudCost, dict[str, list[float]]]:
    """Measure until the step fit makes physical sense (at most ``MAX_ATTEMPTS`` rounds;
    then the round with the fewest problems, with a warning). Returns the cost model and
    the raw samples, which include the 1-minute load average seen while measuring."""
    best: tuple[int, CloudCost, dict[str, list[float]]] | None = None
    for attempt in range(1, MAX_ATTEMPTS + 1):
        cost, samples, problems = _measure_once(target, engine, repeats=repeats)
        if not problems:
            return cost, samples
        log.warning("calibration round %d: the step fit makes no sense (%s); measuring again",
                    attempt, "; ".join(problems[:3]))
        if best is None or len(problems) < best[0]:
            best = (len(problems), cost, samples)
    assert best is not None
    log.warning("calibration: keeping the least bad of %d rounds; the machine may be busy "
                "(load %.1f); rerun with --recalibrate when it is idle", MAX_ATTEMPTS,
                best[2]["load_avg_1m"][0])
    return best[1], best[2]


def _measure_once(
    target: TargetModel, engine: BatchedEngine, *, repeats: int
) -> tuple[CloudCost, dict[str, list[float]], list[str]]:
    """One round: prefill and batched step timings, the fit, and its problems."""
    g = target.geometry
    s = g.image_size
    pixels = torch.zeros(1, g.num_frames, 3, s, s, dtype=target.dtype, device=target.device)
    short_q = target.build_prompt_ids("What is moving?")
    long_q = target.build_prompt_ids("What is moving? " * 16)
    samples: dict[str, list[float]] = {"prefill_short_ms": [], "prefill_long_ms": []}
    for _ in range(repeats + 1):  # the first round warms kernels and is discarded
        for key, ids in (("prefill_short_ms", short_q), ("prefill_long_ms", long_q)):
            request = PrefillRequest(0, ids, pixel_values_videos=pixels)
            samples[key].append(_timed(target, partial(engine.prefill, [request])))
    for key in samples:
        samples[key] = samples[key][1:]
    batches = [b for b in BATCH_SIZES if b <= engine.num_slots]
    for slot in range(max(batches)):
        engine.prefill([PrefillRequest(slot, short_q, pixel_values_videos=pixels)])
    points: list[tuple[int, int, float]] = []  # (sessions, tokens, median ms)
    for b in batches:
        for k in STEP_WIDTHS:
            batch = StepBatch(
                slots=tuple(range(b)), start_positions=(len(short_q),) * b, counts=(k,) * b,
                token_ids=torch.ones(b * k, dtype=torch.long, device=engine.device),  # [N]
            )
            times = [_timed(target, partial(engine.step, batch)) for _ in range(repeats + 1)][1:]
            samples[f"step_b{b}_k{k}_ms"] = times
            points.append((b, b * k, statistics.median(times)))
    for slot in range(max(batches)):
        engine.free(slot)

    visual = g.num_frames * g.tokens_per_frame
    short_text, long_text = len(short_q) - visual, len(long_q) - visual
    p_short = statistics.median(samples["prefill_short_ms"])
    p_long = statistics.median(samples["prefill_long_ms"])
    per_text = max(0.0, (p_long - p_short) / max(1, long_text - short_text))
    per_visual = max(0.0, (p_short - per_text * short_text) / visual)
    fit = fit_step_cost(points)
    base, per_session, per_token = fit
    samples["load_avg_1m"] = [_load_average()]
    cost = CloudCost(
        prefill_base_ms=0.0,
        prefill_ms_per_visual_token=per_visual,
        prefill_ms_per_text_token=per_text,
        step_base_ms=max(base, 1e-3),
        step_ms_per_token=max(per_token, 0.0),
        device=_device_name(target),
        step_ms_per_session=max(per_session, 0.0),
    )
    return cost, samples, fit_problems(fit, points)


def spot_check(target: TargetModel, engine: BatchedEngine, cost: CloudCost) -> float:
    """Measured over predicted time of a one-session, one-token step (median of 3)."""
    g = target.geometry
    s = g.image_size
    pixels = torch.zeros(1, g.num_frames, 3, s, s, dtype=target.dtype, device=target.device)
    ids = target.build_prompt_ids("What is moving?")
    engine.prefill([PrefillRequest(0, ids, pixel_values_videos=pixels)])
    batch = StepBatch(slots=(0,), start_positions=(len(ids),), counts=(1,),
                      token_ids=torch.ones(1, dtype=torch.long, device=engine.device))  # [1]
    try:
        times = [_timed(target, partial(engine.step, batch)) for _ in range(4)][1:]
    finally:
        engine.free(0)
    predicted = cost.step_base_ms + cost.step_ms_per_token
    return statistics.median(times) / max(predicted, 1e-6)


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return -1.0


def fit_step_cost(points: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """Least squares ms = base + per_session * (B - 1) + per_token * N over (B, N, ms)
    points -> (base, per_session, per_token). With a single batch size the session term
    cannot be told apart from the base and is 0."""
    sessions = {b for b, _, _ in points}
    cols = [[1.0, float(b - 1), float(n)] for b, n, _ in points]
    if len(sessions) < 2:
        cols = [[c[0], c[2]] for c in cols]
    a = torch.tensor(cols, dtype=torch.float64)  # [P, 2 or 3]
    y = torch.tensor([[ms] for _, _, ms in points], dtype=torch.float64)  # [P, 1]
    sol = torch.linalg.lstsq(a, y).solution.flatten().tolist()
    if len(sessions) < 2:
        return sol[0], 0.0, sol[1]
    return sol[0], sol[1], sol[2]


def _timed(target: TargetModel, fn: Callable[[], object]) -> float:
    _sync(target)
    t0 = time.perf_counter()
    fn()
    _sync(target)
    return (time.perf_counter() - t0) * 1e3


def load_or_calibrate(
    target: TargetModel, engine: BatchedEngine, path: Path, *, recalibrate: bool = False
) -> CloudCost:
    """Reuse a matching profile file, or measure and save a new one."""
    device = _device_name(target)
    if not recalibrate and path.exists():
        try:
            profile = load_profile(
                path, expected_role="cloud", expected_model_id=target.model_id,
                expected_device=device,
            )
            if profile.cloud is not None:
                ratio = spot_check(target, engine, profile.cloud)
                if 1 / SPOT_CHECK_FACTOR <= ratio <= SPOT_CHECK_FACTOR:
                    log.info("using calibration profile %s (a real step took %.2fx its "
                             "prediction)", path, ratio)
                    return profile.cloud
                log.warning("calibration profile %s is stale: a real step took %.2fx its "
                            "prediction; measuring again", path, ratio)
        except EventSpecError as exc:
            log.warning("ignoring calibration profile %s: %s", path, exc)
    log.info("calibrating the cost model on %s ...", device)
    cost, samples = measure_cloud_cost(target, engine)
    profile = CalibrationProfile(
        role="cloud", model_id=target.model_id, device=device, created_unix=time.time(),
        cloud=cost, edge=None, samples=samples,
    )
    try:
        save_profile(path, profile)
        log.info("saved calibration profile %s", path)
    except OSError as exc:
        log.warning("could not save calibration profile %s: %s", path, exc)
    return cost


def _sync(target: TargetModel) -> None:
    if str(target.device).startswith("cuda"):
        torch.cuda.synchronize()


def _device_name(target: TargetModel) -> str:
    dev = str(target.device)
    if dev.startswith("cuda") and torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name()}:{target.dtype}"
    return f"{dev}:{target.dtype}"
