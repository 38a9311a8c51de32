"""Warm-up calibration of the cloud's cost model, persisted as a profile file.

Times real prefills and verify steps of the loaded target on dummy inputs and fits the
linear cost model that ``shared.timing`` uses: prefill = base + per-visual-token *
visual + per-text-token * text, step(k) = base + per-token * k. The result is saved with
the model identity and device, and reused at the next start if they match.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import torch

from cloud.engine.base import TargetEngine
from cloud.target import TargetModel
from shared.errors import EventSpecError
from shared.profile import CalibrationProfile, fit_linear, load_profile, save_profile
from shared.timing import CloudCost

log = logging.getLogger(__name__)

STEP_WIDTHS = (1, 2, 4, 8, 16)


def measure_cloud_cost(
    target: TargetModel, engine: TargetEngine, *, repeats: int = 3
) -> tuple[CloudCost, dict[str, list[float]]]:
    """Measure prefill and step costs on the loaded target; returns the fit and raw samples."""
    g = target.geometry
    s = g.image_size
    pixels = torch.zeros(1, g.num_frames, 3, s, s, dtype=target.dtype, device=target.device)
    short_q = target.build_prompt_ids("What is moving?")
    long_q = target.build_prompt_ids("What is moving? " * 16)
    samples: dict[str, list[float]] = {"prefill_short_ms": [], "prefill_long_ms": []}
    state = None
    for _ in range(repeats + 1):  # the first round warms kernels and is discarded
        for key, ids in (("prefill_short_ms", short_q), ("prefill_long_ms", long_q)):
            if state is not None:
                engine.release(state)
            _sync(target)
            t0 = time.perf_counter()
            state, _ = engine.prefill(ids, pixel_values_videos=pixels)
            _sync(target)
            samples[key].append((time.perf_counter() - t0) * 1e3)
    for key in samples:
        samples[key] = samples[key][1:]
    assert state is not None
    base_len = engine.seq_len(state)
    for k in STEP_WIDTHS:
        times = []
        for _ in range(repeats + 1):
            _sync(target)
            t0 = time.perf_counter()
            engine.step(state, [1] * k)
            _sync(target)
            times.append((time.perf_counter() - t0) * 1e3)
            engine.rollback(state, base_len)
        samples[f"step_k{k}_ms"] = times[1:]
    engine.release(state)

    visual = g.num_frames * g.tokens_per_frame
    short_text, long_text = len(short_q) - visual, len(long_q) - visual
    p_short = statistics.median(samples["prefill_short_ms"])
    p_long = statistics.median(samples["prefill_long_ms"])
    per_text = max(0.0, (p_long - p_short) / max(1, long_text - short_text))
    per_visual = max(0.0, (p_short - per_text * short_text) / visual)
    step_base, step_per = fit_linear(
        [float(k) for k in STEP_WIDTHS],
        [statistics.median(samples[f"step_k{k}_ms"]) for k in STEP_WIDTHS],
    )
    cost = CloudCost(
        prefill_base_ms=0.0,
        prefill_ms_per_visual_token=per_visual,
        prefill_ms_per_text_token=per_text,
        step_base_ms=max(step_base, 1e-3),
        step_ms_per_token=max(step_per, 0.0),
        device=_device_name(target),
    )
    return cost, samples


def load_or_calibrate(
    target: TargetModel, engine: TargetEngine, path: Path, *, recalibrate: bool = False
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
