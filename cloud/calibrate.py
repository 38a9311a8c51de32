"""Warm-up calibration of the cloud's cost model, persisted as a profile file.

Times real prefills and batched verify steps of the loaded engine on dummy inputs and
fits the linear cost model that ``eventspec.shared.contract.timing`` uses:
prefill = per-visual-token * visual + per-text-token * text, and a step over B sessions feeding N
tokens = base + per-session * (B - 1) + per-token * N (non-negative least squares over the medians
of a grid of B and tokens per session, with the worst outliers set aside). The result is
saved with the model identity and device, and reused at the next start if they match.

Timings taken on a busy machine can be nonsense (a negative slope clamped to 0 with a
huge intercept once made a fresh cloud believe a 3-11 ms step cost 260 ms). So a fit is
checked before it is trusted (no point far from the fit once at most a quarter of the
points are set aside as outliers) and re-measured when it fails; a fit that never passes
is used for this run only, labelled unreliable in GetServerInfo, and never saved. The
machine's load average is recorded with the samples, and a reused profile is
spot-checked against a few real steps and re-measured when it is off by more than 2x.
``--recalibrate`` forces a fresh measurement. Progress goes to ``progress`` (the server
shows it in its log and in its warming-up status).
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from eventspec.cloud.engine.base import BatchedEngine, KvByLengthEngine, PrefillRequest
from eventspec.cloud.target import TargetModel
from eventspec.shared.contract.errors import EventSpecError
from eventspec.shared.contract.profile import CalibrationProfile, load_profile, save_profile
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.node.static.batch import StepBatch

log = logging.getLogger(__name__)

STEP_WIDTHS = (1, 4, 8, 16)
BATCH_SIZES = (1, 2, 4, 8, 16)
#: Timings per prefill and per (B, k) point in one round; each point's median is fitted.
REPEATS = 5
#: A fit may miss a measured point by at most this fraction of it.
MAX_RELATIVE_RESIDUAL = 0.5
#: At most this share of the points may be set aside as outliers (a step that met a
#: busy moment) before a round counts as failed.
MAX_OUTLIER_FRACTION = 0.25
#: Measuring rounds before the best (least bad) fit is used for this run only.
MAX_ATTEMPTS = 3
#: A reused profile whose one-token step is off by more than this factor is re-measured.
SPOT_CHECK_FACTOR = 2.0

#: The questions of the short and the long calibration prompt.
SHORT_QUESTION = "What is moving?"
LONG_QUESTION = "What is moving? " * 16

#: Receives one line per calibration stage ("round 2 of 3: steps, B = 4").
Progress = Callable[[str], None]


def no_progress(_: str) -> None:
    """The default progress sink: say nothing."""


def fit_problems(
    fit: tuple[float, float, float], points: list[tuple[int, int, float]]
) -> list[str]:
    """Why a step-cost fit makes no physical sense (empty when it does): a negative
    slope or intercept, or a measured point far from the fitted line."""
    base, per_session, per_token = fit
    problems = [f"{name} {value:.3g} ms < 0" for name, value in
                (("base", base), ("per-session slope", per_session),
                 ("per-token slope", per_token)) if value < -1e-6]
    problems += [f"B={b}, N={n}: measured {ms:.2f} ms, fit {_predict(fit, b, n):.2f} ms"
                 for b, n, ms in _far_points(fit, points)]
    return problems


def _predict(fit: tuple[float, float, float], sessions: int, tokens: int) -> float:
    base, per_session, per_token = fit
    return base + per_session * (sessions - 1) + per_token * tokens


def _far_points(
    fit: tuple[float, float, float], points: list[tuple[int, int, float]]
) -> list[tuple[int, int, float]]:
    """Points the fit misses by more than ``MAX_RELATIVE_RESIDUAL`` of their value,
    the largest miss in ms first (a gross outlier drags the fit away from the small
    points, whose relative misses then look worst: the absolute miss finds the cause)."""
    far = [(abs(_predict(fit, b, n) - ms), (b, n, ms)) for b, n, ms in points
           if ms > 0 and abs(_predict(fit, b, n) - ms) > MAX_RELATIVE_RESIDUAL * ms]
    return [p for _, p in sorted(far, reverse=True)]


def robust_step_fit(
    points: list[tuple[int, int, float]],
) -> tuple[tuple[float, float, float], list[str], int]:
    """Fit, set aside the worst outliers (at most ``MAX_OUTLIER_FRACTION`` of the points,
    one at a time, refitting after each), and check what is left.

    Returns (fit, problems, outliers set aside). Each point is already the median of
    ``REPEATS`` timings, so one slow timing cannot move it; a whole point taken while the
    machine was busy is what the outlier step removes.
    """
    kept = list(points)
    fit = fit_step_cost(kept)
    budget = int(MAX_OUTLIER_FRACTION * len(points))
    dropped = 0
    while dropped < budget and len(kept) > 3:
        if not _far_points(fit, kept):
            break
        worst = max(kept, key=lambda p: abs(_predict(fit, p[0], p[1]) - p[2]))
        kept.remove(worst)
        dropped += 1
        fit = fit_step_cost(kept)
    return fit, fit_problems(fit, kept), dropped


def measure_cloud_cost(
    target: TargetModel, engine: BatchedEngine, *, repeats: int = REPEATS,
    progress: Progress = no_progress,
) -> tuple[CloudCost, dict[str, list[float]]]:
    """Measure until the step fit makes physical sense (at most ``MAX_ATTEMPTS`` rounds).

    When every round fails its sanity check, the round with the fewest problems is
    returned marked ``unreliable`` (the caller uses it for this run only and never saves
    it). Returns the cost model and the raw samples, which include the 1-minute load
    average seen while measuring.
    """
    best: tuple[int, CloudCost, dict[str, list[float]], list[str]] | None = None
    started = time.perf_counter()
    for attempt in range(1, MAX_ATTEMPTS + 1):
        round_started = time.perf_counter()
        cost, samples, problems = _measure_once(
            target, engine, repeats=repeats,
            progress=lambda stage, a=attempt: progress(  # type: ignore[misc]
                f"calibrating, round {a} of {MAX_ATTEMPTS}: {stage}"),
        )
        took = time.perf_counter() - round_started
        if not problems:
            log.info("calibration round %d of %d passed its sanity check in %.1f s",
                     attempt, MAX_ATTEMPTS, took)
            return replace(cost, calibration=f"measured at warm-up (round {attempt})"), samples
        log.warning("calibration round %d of %d failed its sanity check in %.1f s (%s); %s",
                    attempt, MAX_ATTEMPTS, took, "; ".join(problems[:3]),
                    "measuring again" if attempt < MAX_ATTEMPTS else "giving up")
        if best is None or len(problems) < best[0]:
            best = (len(problems), cost, samples, problems)
    assert best is not None
    _, cost, samples, problems = best
    load = samples["load_avg_1m"][0]
    log.warning("CALIBRATION UNRELIABLE after %d rounds (%.0f s; load average %.1f): using "
                "the least bad fit for this run only, not saving it; plans may be off. Rerun "
                "with --recalibrate when the machine is idle.", MAX_ATTEMPTS,
                time.perf_counter() - started, load)
    label = f"unreliable, this run only ({problems[0]}; load average {load:.1f})"
    return replace(cost, calibration=label, unreliable=True), samples


def calibration_run_positions(target: TargetModel) -> int:
    """KV positions one calibration session uses: the long prompt with room for its first
    token, or the short prompt and the widest step after it, whichever is more."""
    short = len(target.build_prompt_ids(SHORT_QUESTION))
    long = len(target.build_prompt_ids(LONG_QUESTION))
    return max(long + 1, short + max(STEP_WIDTHS))


def calibration_sessions(engine: BatchedEngine, positions: int) -> int:
    """How many calibration sessions of ``positions`` the engine's KV holds at once:
    its slots, or with KV by length the runs that fit its arena (at most its sessions)."""
    arena = _arena_positions(engine)
    if arena is None:
        return engine.num_slots
    return min(engine.num_slots, arena // positions)


@contextmanager
def calibration_slots(engine: BatchedEngine, count: int, positions: int) -> Iterator[list[int]]:
    """``count`` sessions' slots for calibration's own prefills and steps, freed after.

    Why a context: with KV by length (the static engine's default layout) a slot id is a
    run's first position and a prefill fits only the run reserved there, so the sessions
    take back-to-back runs of ``positions``, reserved first, exactly as the scheduler's
    pool hands them out (``eventspec.cloud.scheduling.kv_arena``). With fixed slots they are slots
    ``0 .. count - 1``. Either way nothing is held once calibration ends, so the server
    starts with all its KV free."""
    arena = _arena_positions(engine)
    slots = list(range(count)) if arena is None else [i * positions for i in range(count)]
    try:
        if arena is not None:
            if count * positions > arena:
                raise EventSpecError(f"calibration needs {count} runs of {positions} KV "
                                     f"positions; the arena holds {arena}")
            assert isinstance(engine, KvByLengthEngine)
            for slot in slots:
                engine.reserve(slot, positions)
        yield slots
    finally:
        for slot in slots:
            engine.free(slot)


def _arena_positions(engine: BatchedEngine) -> int | None:
    """The engine's KV-by-length arena size, or None for fixed slots."""
    if isinstance(engine, KvByLengthEngine):
        return engine.kv_positions
    return None


def _measure_once(
    target: TargetModel, engine: BatchedEngine, *, repeats: int, progress: Progress = no_progress,
) -> tuple[CloudCost, dict[str, list[float]], list[str]]:
    """One round: prefill and batched step timings, the robust fit, and its problems."""
    g = target.geometry
    s = g.image_size
    pixels = torch.zeros(1, g.num_frames, 3, s, s, dtype=target.dtype, device=target.device)
    short_q = target.build_prompt_ids(SHORT_QUESTION)
    long_q = target.build_prompt_ids(LONG_QUESTION)
    run = calibration_run_positions(target)
    batches = [b for b in BATCH_SIZES if b <= calibration_sessions(engine, run)]
    if not batches:
        raise EventSpecError(f"the KV holds no calibration session of {run} positions; "
                             "raise --kv-cache-gb or --max-seq-len")
    samples: dict[str, list[float]] = {"prefill_short_ms": [], "prefill_long_ms": []}
    points: list[tuple[int, int, float]] = []  # (sessions, tokens, median ms)
    with calibration_slots(engine, max(batches), run) as slots:
        progress("prefill")
        for _ in range(repeats + 1):  # the first round warms kernels and is discarded
            for key, ids in (("prefill_short_ms", short_q), ("prefill_long_ms", long_q)):
                request = PrefillRequest(slots[0], ids, pixel_values_videos=pixels)
                samples[key].append(_timed(target, partial(engine.prefill, [request])))
        for key in samples:
            samples[key] = samples[key][1:]
        for slot in slots:
            engine.prefill([PrefillRequest(slot, short_q, pixel_values_videos=pixels)])
        for i, b in enumerate(batches, 1):
            progress(f"steps of {b} session(s) ({i} of {len(batches)} batch sizes)")
            for k in STEP_WIDTHS:
                batch = StepBatch(
                    slots=tuple(slots[:b]), start_positions=(len(short_q),) * b,
                    counts=(k,) * b,
                    token_ids=torch.ones(b * k, dtype=torch.long, device=engine.device),  # [N]
                )
                times = [_timed(target, partial(engine.step, batch))
                         for _ in range(repeats + 1)][1:]
                samples[f"step_b{b}_k{k}_ms"] = times
                points.append((b, b * k, statistics.median(times)))

    visual = g.num_frames * g.tokens_per_frame
    short_text, long_text = len(short_q) - visual, len(long_q) - visual
    p_short = statistics.median(samples["prefill_short_ms"])
    p_long = statistics.median(samples["prefill_long_ms"])
    per_text = max(0.0, (p_long - p_short) / max(1, long_text - short_text))
    per_visual = max(0.0, (p_short - per_text * short_text) / visual)
    fit, problems, outliers = robust_step_fit(points)
    base, per_session, per_token = fit
    samples["load_avg_1m"] = [_load_average()]
    samples["step_outliers_set_aside"] = [float(outliers)]
    cost = CloudCost(
        prefill_base_ms=0.0,
        prefill_ms_per_visual_token=per_visual,
        prefill_ms_per_text_token=per_text,
        step_base_ms=max(base, 1e-3),
        step_ms_per_token=max(per_token, 0.0),
        device=_device_name(target),
        step_ms_per_session=max(per_session, 0.0),
    )
    return cost, samples, problems


def spot_check(target: TargetModel, engine: BatchedEngine, cost: CloudCost) -> float:
    """Measured over predicted time of a one-session, one-token step (median of 3)."""
    g = target.geometry
    s = g.image_size
    pixels = torch.zeros(1, g.num_frames, 3, s, s, dtype=target.dtype, device=target.device)
    ids = target.build_prompt_ids(SHORT_QUESTION)
    with calibration_slots(engine, 1, calibration_run_positions(target)) as (slot,):
        engine.prefill([PrefillRequest(slot, ids, pixel_values_videos=pixels)])
        batch = StepBatch(slots=(slot,), start_positions=(len(ids),), counts=(1,),
                          token_ids=torch.ones(1, dtype=torch.long, device=engine.device))  # [1]
        times = [_timed(target, partial(engine.step, batch)) for _ in range(4)][1:]
    predicted = cost.step_base_ms + cost.step_ms_per_token
    return statistics.median(times) / max(predicted, 1e-6)


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return -1.0


def fit_step_cost(points: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """Non-negative least squares ms = base + per_session * (B - 1) + per_token * N over
    (B, N, ms) points -> (base, per_session, per_token).

    Costs cannot be negative, so instead of clamping an unconstrained fit (which once
    gave a negative slope and a huge intercept on a busy machine), every subset of the
    three terms is fitted and the best fit with no negative coefficient wins: with three
    unknowns that is exact NNLS (Lawson and Hanson 1974) in 7 small solves. With a single
    batch size the session term cannot be told apart from the base and is 0.
    """
    if not points:
        raise ValueError("no step timings to fit")
    sessions = {b for b, _, _ in points}
    rows = torch.tensor([[1.0, float(b - 1), float(n)] for b, n, _ in points],
                        dtype=torch.float64)  # [P, 3]
    y = torch.tensor([ms for _, _, ms in points], dtype=torch.float64)  # [P]
    usable = [0, 1, 2] if len(sessions) > 1 else [0, 2]
    best: tuple[float, list[float]] | None = None
    for mask in range(1, 1 << len(usable)):
        cols = [c for i, c in enumerate(usable) if mask >> i & 1]
        a = rows[:, cols]  # [P, len(cols)]
        sol = torch.linalg.lstsq(a, y.unsqueeze(1)).solution.flatten()  # [len(cols)]
        if bool((sol < 0).any()):
            continue
        residual = float(((a @ sol - y) ** 2).sum())
        if best is None or residual < best[0] - 1e-12:
            coef = [0.0, 0.0, 0.0]
            for c, v in zip(cols, sol.tolist(), strict=True):
                coef[c] = v
            best = (residual, coef)
    assert best is not None  # the base alone always fits with a non-negative mean
    base, per_session, per_token = best[1]
    return base, per_session, per_token


def _timed(target: TargetModel, fn: Callable[[], object]) -> float:
    _sync(target)
    t0 = time.perf_counter()
    fn()
    _sync(target)
    return (time.perf_counter() - t0) * 1e3


def load_or_calibrate(
    target: TargetModel, engine: BatchedEngine, path: Path, *, recalibrate: bool = False,
    progress: Progress = no_progress, kernels: str = "",
) -> CloudCost:
    """Reuse a matching profile file, or measure and save a new one.

    ``kernels`` (:attr:`~eventspec.cloud.config.CloudSettings.kernels`) is part of the
    device a profile must match: the spot check times one session, which the kernels
    barely change, while a 16-session step they change by 1.5x. A measurement that
    failed its own sanity check is used for this run only: it is never saved, so the
    next start measures again instead of trusting it.
    """
    device = _device_name(target) + (f":{kernels}" if kernels else "")
    if not recalibrate and path.exists():
        try:
            profile = load_profile(
                path, expected_role="cloud", expected_model_id=target.model_id,
                expected_device=device,
            )
            if profile.cloud is not None:
                progress("checking the saved calibration profile")
                ratio = spot_check(target, engine, profile.cloud)
                if 1 / SPOT_CHECK_FACTOR <= ratio <= SPOT_CHECK_FACTOR:
                    log.info("using calibration profile %s (a real step took %.2fx its "
                             "prediction)", path, ratio)
                    return replace(profile.cloud, calibration=f"profile file {path.name}")
                log.warning("calibration profile %s is stale: a real step took %.2fx its "
                            "prediction; measuring again", path, ratio)
        except EventSpecError as exc:
            log.warning("ignoring calibration profile %s: %s", path, exc)
    log.info("calibrating the cost model on %s (up to %d rounds of %d prefills and up to %d "
             "steps each; progress follows) ...", device, MAX_ATTEMPTS, 2 * (REPEATS + 1),
             len(BATCH_SIZES) * len(STEP_WIDTHS) * (REPEATS + 1))
    cost, samples = measure_cloud_cost(target, engine, progress=progress)
    if cost.unreliable:
        return cost
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
