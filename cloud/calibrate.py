"""Warm-up calibration of the cloud's cost model, persisted as a profile file.

Times real prefills and batched verify steps of the loaded engine on dummy inputs and
fits the linear cost model that ``shared.timing`` uses: prefill = per-visual-token *
visual + per-text-token * text, and a step over B sessions feeding N tokens = base +
per-session * (B - 1) + per-token * N (least squares over a small grid of B and tokens
per session). The result is saved with the model identity and device, and reused at the
next start if they match.
"""

from __future__ import annotations

import logging
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


def measure_cloud_cost(
    target: TargetModel, engine: BatchedEngine, *, repeats: int = 3
) -> tuple[CloudCost, dict[str, list[float]]]:
    """Measure prefill and batched step costs; returns the fit and the raw samples."""
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
    base, per_session, per_token = fit_step_cost(points)
    cost = CloudCost(
        prefill_base_ms=0.0,
        prefill_ms_per_visual_token=per_visual,
        prefill_ms_per_text_token=per_text,
        step_base_ms=max(base, 1e-3),
        step_ms_per_token=max(per_token, 0.0),
        device=_device_name(target),
        step_ms_per_session=max(per_session, 0.0),
    )
    return cost, samples


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
                log.info("using calibration profile %s", path)
                return profile.cloud
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
