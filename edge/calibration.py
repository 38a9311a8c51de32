"""The edge's calibrated profile: what its vision path, draft prefill and draft tokens cost
on this machine, with the drafter it actually runs, stored and reused like the cloud's.

The shared timing plan (``eventspec.shared.contract.timing_model``) decides how many
drafts hide inside the cloud's prefill and whether drafting pays from these numbers,
and the edge sends them to the cloud in every ``Open``, so both nodes plan with them.
They depend on the drafter (HF eager or the static runtime, its weight quantisation)
and the vision backend, so a profile is keyed by all of them: a profile measured with
bf16 weights is never reused for int4.

At start the edge always drafts a short warm-up (it also pays the one-off costs:
allocations, kernel tuning). With a matching saved profile, that warm-up is the spot
check: within a factor of two the saved medians (more samples) are used; otherwise, or
without a profile, the edge measures ``MEASURE_ROUNDS`` rounds and saves them.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch

from eventspec.edge.drafting.cache import DraftBackend, DraftCache
from eventspec.shared.contract.errors import EventSpecError
from eventspec.shared.contract.profile import CalibrationProfile, load_profile, save_profile
from eventspec.shared.contract.timing import MIN_MS, EdgeCost

log = logging.getLogger(__name__)

#: Rounds a fresh calibration measures (each: the vision path, a prefill, 8 drafts).
MEASURE_ROUNDS: Final[int] = 5
#: A saved profile is reused while the warm-up's cost per token is within this factor.
SPOT_CHECK_FACTOR: Final[float] = 2.0
#: Draft tokens per round.
ROUND_TOKENS: Final[int] = 8
_QUESTION: Final[str] = "What is moving?"


@dataclass(frozen=True)
class EdgeMeasurement:
    """Medians over rounds, in ms; ``prefill_ms`` includes the vision path (the draft
    prefills from pixels), ``vision_ms`` is that path alone."""

    vision_ms: float
    prefill_ms: float
    ms_per_token: float
    samples: dict[str, list[float]]
    source: str = "measured"


def measure_drafting(
    backend: DraftBackend, pixels: torch.Tensor, *, eos_token_id: int, rounds: int,
    vision: Callable[[torch.Tensor], object], sync: Callable[[], None], warmup: int = 0,
) -> EdgeMeasurement:
    """``warmup`` rounds not counted (they pay one-off costs: allocations, lazy init,
    kernel tuning), then ``rounds`` rounds of: the vision path alone, then a prefill and
    up to ``ROUND_TOKENS`` greedy drafts. Model work: run it on the edge's model thread."""
    samples: dict[str, list[float]] = {"vision_ms": [], "prefill_ms": [], "ms_per_token": []}
    for i in range(warmup + rounds):
        if i == warmup:
            samples = {key: [] for key in samples}
        sync()
        t0 = time.perf_counter()
        vision(pixels)
        sync()
        samples["vision_ms"].append((time.perf_counter() - t0) * 1e3)
        drafter = DraftCache(backend)
        drafter.prefill(_QUESTION, pixels)
        seq: list[int] = []
        while len(seq) < ROUND_TOKENS and (not seq or seq[-1] != eos_token_id):
            seq.append(drafter.draft_next(seq))
        samples["prefill_ms"].append(drafter.prefill_ms)
        samples["ms_per_token"].append(drafter.ms_per_token)
    return EdgeMeasurement(
        vision_ms=statistics.median(samples["vision_ms"]),
        prefill_ms=statistics.median(samples["prefill_ms"]),
        ms_per_token=statistics.median(samples["ms_per_token"]),
        samples=samples,
    )


def profile_key(device: torch.device, dtype: torch.dtype, drafter: str, vision: str) -> str:
    """What a profile is valid for: the device (its name on CUDA), dtype, drafter and
    vision backend, e.g. ``NVIDIA H100 80GB HBM3 bfloat16, static int4 drafter, torch vision``."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return f"{name} {str(dtype).removeprefix('torch.')}, {drafter} drafter, {vision} vision"


def load_saved(path: Path, model_id: str, key: str) -> EdgeMeasurement | None:
    """The saved measurement for this model and key, or None (a mismatch is logged)."""
    if not path.exists():
        return None
    try:
        profile = load_profile(path, expected_role="edge", expected_model_id=model_id,
                               expected_device=key)
    except EventSpecError as exc:
        log.warning("ignoring edge calibration profile %s: %s", path, exc)
        return None
    assert profile.edge is not None  # an edge profile always has one
    vision = profile.samples.get("vision_ms") or [0.0]
    return EdgeMeasurement(
        vision_ms=statistics.median(vision), prefill_ms=profile.edge.draft_prefill_ms,
        ms_per_token=profile.edge.draft_ms_per_token, samples=profile.samples,
        source=f"profile file {path.name}",
    )


def save(path: Path, model_id: str, key: str, m: EdgeMeasurement) -> None:
    """Store ``m`` (atomically); a failure to write is logged, never fatal."""
    # The link (RTT, uplink) and the acceptance are measured live, never stored: zeros
    # here stand for "unknown".
    cost = EdgeCost(draft_prefill_ms=max(m.prefill_ms, MIN_MS),
                    draft_ms_per_token=max(m.ms_per_token, MIN_MS),
                    rtt_ms=0.0, uplink_bytes_per_s=0.0, acceptance_prior=0.0)
    profile = CalibrationProfile(role="edge", model_id=model_id, device=key,
                                 created_unix=time.time(), cloud=None, edge=cost,
                                 samples=m.samples)
    try:
        save_profile(path, profile)
        log.info("saved edge calibration profile %s", path)
    except OSError as exc:
        log.warning("could not save edge calibration profile %s: %s", path, exc)


def agrees(check: EdgeMeasurement, saved: EdgeMeasurement) -> bool:
    """The spot check: the warm-up's cost per token within ``SPOT_CHECK_FACTOR`` of the
    saved one (and its prefill too)."""
    def near(a: float, b: float) -> bool:
        return b > 0 and 1 / SPOT_CHECK_FACTOR <= a / b <= SPOT_CHECK_FACTOR

    return near(check.ms_per_token, saved.ms_per_token) and near(check.prefill_ms,
                                                                 saved.prefill_ms)
