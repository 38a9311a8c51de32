"""A DVS simulator for toy scenes: what an event camera would have reported.

The model is the idealised event pixel used by simulators such as ESIM: each pixel
keeps a reference log intensity and fires an event whenever the current log
intensity has moved one contrast threshold C away from it (ON when brighter, OFF when
darker); the reference then moves by C. Log intensity is sampled finely (1 kHz) and a
crossing's time is interpolated linearly between the two samples around it, so
timestamps are not quantised to the sampling grid, and one interval may hold several
crossings. After an event the pixel is blind for a refractory period; crossings in it
are lost (the reference still moves, so the pixel does not fire a late burst).

Background activity (noise) is added at a rate high enough that every 50 ms window of
a 64x64 sensor holds well over the edge's 100-event minimum, so even a still scene
can be asked about. Its timestamps are jittered on a regular grid rather than
Poisson, which makes that floor a guarantee instead of a likelihood.

In the demo world (not the edge): the trainers need the same events as the edge's
``toy`` source, which imports this module; so it imports no node, and
:data:`TOY_EVENT_DTYPE` restates the edge's event dtype (a test checks they agree).
"""

from __future__ import annotations

import numpy as np

from eventspec.shared.toyworld.scenes import (
    ToyScene,
    background_luminance,
    coverage_at,
    luminance,
    reach_px,
    render_luminance,
)

#: Identical to ``eventspec.edge.events.types.EVENT_DTYPE``: x, y pixels; t µs; p 1 = ON (brighter).
TOY_EVENT_DTYPE = np.dtype([("x", "<u2"), ("y", "<u2"), ("t", "<i8"), ("p", "u1")])
#: Added to luminance (normalised to 0..1) before the log, so black stays finite.
LOG_EPS = 0.01
#: Noise per pixel per second: 0.8 Hz x 4096 px gives ~164 events per 50 ms at 64x64.
DEFAULT_NOISE_RATE_HZ_PER_PX = 0.8
#: Samples rendered at once: bounds memory ([chunk, H, W] float) without slowing the loop.
_CHUNK = 128
_NOISE_SALT = 0x0E7E


def simulate_events(
    scene: ToyScene,
    *,
    threshold: float = 0.2,
    refractory_us: int = 1000,
    sample_hz: float = 1000.0,
    noise_rate_hz_per_px: float = DEFAULT_NOISE_RATE_HZ_PER_PX,
) -> np.ndarray:
    """Events of the whole scene ``[0, duration_us)`` -> [N] TOY_EVENT_DTYPE sorted by t.

    Deterministic for a given scene and settings (noise is seeded by ``scene.seed``).
    Ties in t keep a fixed order (stable sort of signal events, then noise).
    """
    if threshold <= 0 or sample_hz <= 0 or refractory_us < 0 or noise_rate_hz_per_px < 0:
        raise ValueError(
            "threshold and sample_hz must be > 0, refractory_us and noise rate >= 0; got "
            f"{threshold}, {sample_hz}, {refractory_us}, {noise_rate_hz_per_px}"
        )
    duration = scene.duration_us
    n_steps = max(1, round(duration * sample_hz / 1e6))
    times = np.arange(n_steps + 1, dtype=np.float64) * (duration / n_steps)  # [S+1] µs
    signal = _signal_events(scene, times, threshold, float(refractory_us))
    noise = _noise_events(scene, noise_rate_hz_per_px)
    events = np.concatenate([signal, noise])
    out: np.ndarray = events[np.argsort(events["t"], kind="stable")]
    return out


def events_in_window(events: np.ndarray, t0_us: int, t1_us: int) -> np.ndarray:
    """The events with ``t0_us <= t < t1_us`` of a t-sorted array (a view, no copy)."""
    lo, hi = np.searchsorted(events["t"], [t0_us, t1_us], side="left")
    window: np.ndarray = events[int(lo) : int(hi)]
    return window


def _log(luma: np.ndarray) -> np.ndarray:
    """log(luma / 255 + eps) in float64, so crossing times interpolate precisely."""
    out: np.ndarray = np.log(luma.astype(np.float64) / 255.0 + LOG_EPS)
    return out


def _swept_pixels(scene: ToyScene, t0_us: float, t1_us: float) -> np.ndarray:
    """Flat indices of the pixels a moving object may touch in ``[t0_us, t1_us]`` -> [A].

    Motion is linear, so the box around both end positions (grown by the object's
    reach) holds every pixel whose intensity can change; the rest are constant.
    """
    w, h = scene.width, scene.height
    boxes = []
    for obj in scene.objects:
        if obj.velocity_px_s == (0.0, 0.0):
            continue
        cx, cy = obj.centre_at(np.asarray([t0_us, t1_us]))  # [2] each
        r = reach_px(obj) + 0.5
        x0, x1 = max(0, int(np.floor(cx.min() - r))), min(w - 1, int(np.ceil(cx.max() + r)))
        y0, y1 = max(0, int(np.floor(cy.min() - r))), min(h - 1, int(np.ceil(cy.max() + r)))
        if x0 <= x1 and y0 <= y1:
            ys, xs = np.mgrid[y0 : y1 + 1, x0 : x1 + 1]
            boxes.append((ys * w + xs).ravel())
    if not boxes:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.concatenate(boxes))


def _luminance_at(scene: ToyScene, t_us: np.ndarray, pix: np.ndarray) -> np.ndarray:
    """Luma of flat pixels ``pix`` [A] at times ``t_us`` [K] -> [K, A] float32."""
    bg = background_luminance(scene).reshape(-1)[pix]  # [A]
    xs = (pix % scene.width).astype(np.float32)[None, :]  # [1, A]
    ys = (pix // scene.width).astype(np.float32)[None, :]  # [1, A]
    img = np.broadcast_to(bg, (len(t_us), pix.size)).copy()  # [K, A]
    for obj in scene.objects:
        alpha = coverage_at(obj, np.asarray(t_us)[:, None], xs, ys)  # [K, A]
        img += alpha * (np.float32(luminance(obj.rgb)) - img)
    return img


def _signal_events(
    scene: ToyScene, times: np.ndarray, threshold: float, refractory_us: float
) -> np.ndarray:
    """Threshold crossings of every pixel between consecutive samples -> TOY_EVENT_DTYPE.

    The loop runs over time (each pixel's reference depends on its past) but only over
    the pixels a moving object sweeps during the current chunk of samples; the others
    hold a constant intensity and cannot fire.
    """
    width = scene.width
    ref = _log(render_luminance(scene, times[:1])[0].reshape(-1))  # [P] reference levels
    prev = ref.copy()  # [P] log intensity at the previous sample
    last_t = np.full(ref.size, -np.inf)  # [P] time of each pixel's last event
    pix_out: list[np.ndarray] = []
    t_out: list[np.ndarray] = []
    on_out: list[np.ndarray] = []
    for start in range(1, len(times), _CHUNK):
        stop = min(start + _CHUNK, len(times))
        active = _swept_pixels(scene, times[start - 1], times[stop - 1])  # [A]
        if active.size == 0:
            continue
        logs = _log(_luminance_at(scene, times[start:stop], active))  # [K, A]
        a_ref, a_prev, a_last = ref[active], prev[active], last_t[active]  # [A] each
        for k in range(stop - start):
            cur = logs[k]  # [A]
            diff = cur - a_ref
            counts = (np.abs(diff) / threshold).astype(np.int64)  # crossings [A] (floor)
            fired = np.flatnonzero(counts)  # [F] local pixel indices
            if fired.size:
                n = counts[fired]
                sign = np.sign(diff[fired])
                local, ts = _crossings(
                    fired,
                    n,
                    a_ref[fired] + sign * threshold,  # first level crossed
                    sign * threshold,
                    a_prev[fired],
                    cur[fired],
                    (times[start + k - 1], times[start + k]),
                    refractory_us,
                    a_last,
                )
                pix_out.append(active[local])
                t_out.append(ts)
                on_out.append(diff[local] > 0)
                a_ref[fired] += sign * n * threshold
            a_prev = cur
        ref[active], prev[active], last_t[active] = a_ref, a_prev, a_last
    if not pix_out:
        return np.zeros(0, dtype=TOY_EVENT_DTYPE)
    pix_all = np.concatenate(pix_out)
    ev = np.empty(pix_all.size, dtype=TOY_EVENT_DTYPE)
    ev["x"] = pix_all % width
    ev["y"] = pix_all // width
    ev["t"] = np.clip(np.floor(np.concatenate(t_out)), 0, scene.duration_us - 1).astype(np.int64)
    ev["p"] = np.concatenate(on_out)
    return ev


def _crossings(
    fired: np.ndarray,
    counts: np.ndarray,
    first_level: np.ndarray,
    step: np.ndarray,
    p0: np.ndarray,
    p1: np.ndarray,
    span: tuple[float, float],
    refractory_us: float,
    last_t: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The crossings of one sample interval that survive the refractory period.

    ``fired`` [F] are local pixel indices with ``counts`` [F] >= 1 crossings; crossing j
    (0-based) is at level ``first_level + j * step``, reached at the time interpolated
    linearly between ``p0`` (at ``span[0]``) and ``p1`` (at ``span[1]``). ``last_t``
    (indexed by local pixel) is updated in place. Returns (local pixel, time µs) of the
    events kept, pixel by pixel in time order.
    """
    slope = np.where(p1 != p0, p1 - p0, 1.0) / (span[1] - span[0])  # [F] log per µs
    if int(counts.max()) == 1:  # the usual case with soft edges: one crossing each
        t = span[0] + np.clip((first_level - p0) / slope, 0.0, span[1] - span[0])  # [F]
        ok = t - last_t[fired] >= refractory_us
        last_t[fired[ok]] = t[ok]
        return fired[ok], t[ok]
    j = np.arange(int(counts.max()), dtype=np.float64)[None, :]  # [1, J]
    levels = first_level[:, None] + j * step[:, None]  # [F, J]
    times = span[0] + np.clip((levels - p0[:, None]) / slope[:, None], 0.0, span[1] - span[0])
    valid = j < counts[:, None]  # [F, J]
    keep = np.zeros_like(valid)
    for col in range(valid.shape[1]):  # each pixel's crossings in time order
        ok = valid[:, col] & (times[:, col] - last_t[fired] >= refractory_us)  # [F]
        keep[:, col] = ok
        last_t[fired[ok]] = times[ok, col]
    rows, cols = np.nonzero(keep)  # row-major: pixel by pixel, in time order
    return fired[rows], times[rows, cols]


def _noise_events(scene: ToyScene, rate_hz_per_px: float) -> np.ndarray:
    """Background activity: uniform position and polarity, one event per time stratum.

    ``n`` events split the scene into ``n`` equal strata with one uniformly placed
    event each, so any window of length L holds at least ``floor(n L / duration) - 1``.
    """
    rng = np.random.default_rng([scene.seed, _NOISE_SALT])
    duration = scene.duration_us
    n = round(rate_hz_per_px * scene.width * scene.height * duration / 1e6)
    ev = np.empty(n, dtype=TOY_EVENT_DTYPE)
    stamps = (np.arange(n) + rng.random(n)) * (duration / max(n, 1))  # [n] µs, ascending
    ev["t"] = np.clip(np.floor(stamps), 0, duration - 1).astype(np.int64)
    ev["x"] = rng.integers(0, scene.width, n)
    ev["y"] = rng.integers(0, scene.height, n)
    ev["p"] = rng.integers(0, 2, n)
    return ev
