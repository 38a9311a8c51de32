"""A deterministic synthetic scene: moving shapes seen by an RGB camera and an event camera.

The whole system has to run with no dataset on disk (demo, tests, CI), so this renders
a small scene and derives events from it the way an event sensor would: each pixel
fires when its log intensity has changed by a contrast threshold since its last event
(the idealised DVS model used by simulators such as ESIM, Rebecq et al. 2018).
Intensity is sampled finely (1 kHz by default) and crossing times are interpolated
linearly between samples, so timestamps are not quantised to the sampling grid.

The scene is data (:class:`SceneSpec` of :class:`ShapeSpec`) so richer toy worlds can
be built by constructing specs rather than subclassing the renderer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from eventspec.edge.events.base import ArraySource, check_range
from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.shared.contract.errors import InvalidInput

log = logging.getLogger(__name__)

ShapeKind = Literal["circle", "square", "triangle"]
Colour = tuple[int, int, int]

_PALETTE: tuple[tuple[str, Colour], ...] = (
    ("red", (220, 30, 30)),
    ("green", (30, 200, 60)),
    ("blue", (40, 70, 230)),
    ("yellow", (235, 220, 40)),
    ("white", (245, 245, 245)),
)
_BACKGROUNDS: tuple[Colour, ...] = ((40, 40, 40), (90, 90, 90), (20, 30, 60))
_LOG_EPS = 0.02  # keeps log intensity finite on black pixels


@dataclass(frozen=True)
class ShapeSpec:
    """One shape moving at constant velocity, bouncing off the image borders."""

    kind: ShapeKind
    colour: Colour
    size_px: float  # circle radius, square half-side, triangle circumradius
    start_px: tuple[float, float]  # centre (x, y) at t = 0
    velocity_px_s: tuple[float, float]  # (vx, vy)
    name: str = ""  # e.g. "red circle", for captions and questions

    def centre_at(self, t_s: float, width: int, height: int) -> tuple[float, float]:
        """Centre at ``t_s`` seconds, reflected so the shape stays inside the frame."""
        return (
            _bounce(self.start_px[0] + self.velocity_px_s[0] * t_s, self.size_px, width),
            _bounce(self.start_px[1] + self.velocity_px_s[1] * t_s, self.size_px, height),
        )


@dataclass(frozen=True)
class SceneSpec:
    """Everything that determines the synthetic stream; equal specs give equal data."""

    width: int = 96
    height: int = 72
    duration_ms: int = 2000
    background: Colour = (40, 40, 40)
    shapes: tuple[ShapeSpec, ...] = field(default_factory=tuple)
    rgb_fps: float = 30.0
    sample_hz: float = 1000.0  # log-intensity sampling rate for event generation
    contrast_threshold: float = 0.2  # log-intensity step per event
    noise_rate_hz: float = 0.05  # background activity, per pixel
    seed: int = 0  # seeds the noise

    def __post_init__(self) -> None:
        if self.width < 8 or self.height < 8:
            raise InvalidInput(f"synthetic scene too small: {self.width}x{self.height}")
        if self.duration_ms <= 0:
            raise InvalidInput(f"synthetic duration must be positive, got {self.duration_ms} ms")
        if self.rgb_fps <= 0 or self.sample_hz <= 0 or self.contrast_threshold <= 0:
            raise InvalidInput("synthetic rgb_fps, sample_hz and contrast_threshold must be > 0")

    @staticmethod
    def random(
        seed: int = 0, *, width: int = 96, height: int = 72, duration_ms: int = 2000
    ) -> SceneSpec:
        """One or two random shapes with distinct colours, moving fast enough to fire."""
        rng = np.random.default_rng(seed)
        n_shapes = int(rng.integers(1, 3))
        kinds: tuple[ShapeKind, ...] = ("circle", "square", "triangle")
        colours = rng.choice(len(_PALETTE), size=n_shapes, replace=False)
        shapes = []
        short = min(width, height)
        for i in range(n_shapes):
            kind = kinds[int(rng.integers(0, len(kinds)))]
            colour_name, colour = _PALETTE[int(colours[i])]
            size = float(rng.uniform(0.12, 0.2) * short)
            start = (
                float(rng.uniform(size, width - size)),
                float(rng.uniform(size, height - size)),
            )
            speed = float(rng.uniform(0.4, 0.9) * width)  # px/s
            angle = float(rng.uniform(0.0, 2.0 * np.pi))
            velocity = (speed * float(np.cos(angle)), speed * float(np.sin(angle)))
            shapes.append(
                ShapeSpec(kind, colour, size, start, velocity, name=f"{colour_name} {kind}")
            )
        background = _BACKGROUNDS[int(rng.integers(0, len(_BACKGROUNDS)))]
        return SceneSpec(
            width=width,
            height=height,
            duration_ms=duration_ms,
            background=background,
            shapes=tuple(shapes),
            seed=seed,
        )


def render_frame(scene: SceneSpec, t_us: int) -> np.ndarray:
    """The RGB frame at ``t_us`` -> [H, W, 3] uint8 (anti-aliased shape edges)."""
    rgb = _render(scene, t_us / 1e6, np.asarray(scene.background, dtype=np.float32), colour=True)
    out: np.ndarray = np.clip(np.rint(rgb), 0, 255).astype(np.uint8)
    return out


def _luma(colour: Colour) -> float:
    r, g, b = colour
    return 0.299 * r + 0.587 * g + 0.114 * b


def _render(scene: SceneSpec, t_s: float, background: np.ndarray, *, colour: bool) -> np.ndarray:
    """Composite the shapes over the background -> [H, W, 3] (colour) or [H, W] float32.

    Only each shape's bounding box is touched: the simulator renders thousands of
    samples per second of scene, so this is the hot loop.
    """
    h, w = scene.height, scene.width
    shape = (h, w, 3) if colour else (h, w)
    img = np.broadcast_to(background, shape).astype(np.float32)  # copy
    for spec in scene.shapes:
        cx, cy = spec.centre_at(t_s, w, h)
        r = spec.size_px + 1.0
        x0, x1 = max(0, int(cx - r)), min(w, int(np.ceil(cx + r)) + 1)
        y0, y1 = max(0, int(cy - r)), min(h, int(np.ceil(cy + r)) + 1)
        if x0 >= x1 or y0 >= y1:
            continue
        dx = np.arange(x0, x1, dtype=np.float32)[None, :] - np.float32(cx)  # [1, bw]
        dy = np.arange(y0, y1, dtype=np.float32)[:, None] - np.float32(cy)  # [bh, 1]
        alpha = _coverage(spec, dx, dy)  # [bh, bw] in [0, 1]
        patch = img[y0:y1, x0:x1]  # view
        if colour:
            value = np.asarray(spec.colour, dtype=np.float32)
            patch += alpha[..., None] * (value - patch)
        else:
            patch += alpha * (np.float32(_luma(spec.colour)) - patch)
    return img


def _coverage(spec: ShapeSpec, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Approximate pixel coverage in [0, 1] from a signed distance (one-pixel ramp)."""
    s = spec.size_px
    if spec.kind == "circle":
        inside = s - np.sqrt(dx * dx + dy * dy)
    elif spec.kind == "square":
        inside = s - np.maximum(np.abs(dx), np.abs(dy))
    else:  # equilateral triangle pointing up, circumradius s, inradius s/2
        normals = ((0.0, 1.0), (0.8660254, -0.5), (-0.8660254, -0.5))
        dist = np.max(np.stack([nx * dx + ny * dy for nx, ny in normals]), axis=0)
        inside = s / 2 - dist
    alpha: np.ndarray = np.clip(inside + 0.5, 0.0, 1.0)
    return alpha


def _bounce(pos: float, margin: float, extent: int) -> float:
    """Reflect ``pos`` into ``[margin, extent - margin]`` (a triangle wave)."""
    span = extent - 2.0 * margin
    if span <= 0:
        return extent / 2.0
    u = (pos - margin) % (2.0 * span)
    return margin + (u if u <= span else 2.0 * span - u)


def simulate_events(scene: SceneSpec) -> np.ndarray:
    """DVS events for the whole scene -> EVENT_DTYPE array sorted by t.

    Per pixel, an event fires each time log intensity moves one contrast threshold C
    away from the pixel's reference level; the reference then moves by C. Crossing
    times are interpolated linearly between the two intensity samples around them.
    """
    c = scene.contrast_threshold
    duration_us = scene.duration_ms * 1000
    n_steps = max(1, round(scene.duration_ms * scene.sample_hz / 1000.0))
    times_us = np.linspace(0.0, duration_us - 1, n_steps + 1)  # sample instants
    bg = np.array(_luma(scene.background), dtype=np.float32)  # 0-d

    prev = np.log(_render(scene, 0.0, bg, colour=False) / 255.0 + _LOG_EPS).ravel()  # [H*W]
    ref = prev.copy()
    chunks: list[np.ndarray] = []
    for k in range(1, n_steps + 1):
        cur = np.log(_render(scene, times_us[k] / 1e6, bg, colour=False) / 255.0 + _LOG_EPS)
        cur = cur.ravel()
        diff = cur - ref
        n = np.floor(np.abs(diff) / c).astype(np.int64)  # crossings per pixel this step
        pix = np.flatnonzero(n)
        if pix.size:
            counts = n[pix]
            sign = np.sign(diff[pix])
            rep = np.repeat(np.arange(pix.size), counts)  # which firing pixel
            starts = np.cumsum(counts) - counts
            j = np.arange(rep.size) - starts[rep] + 1  # crossing number 1..n
            level = ref[pix][rep] + sign[rep] * j * c
            p0, p1 = prev[pix][rep], cur[pix][rep]
            denom = np.where(p1 != p0, p1 - p0, 1.0)
            frac = np.clip((level - p0) / denom, 0.0, 1.0)
            t = times_us[k - 1] + frac * (times_us[k] - times_us[k - 1])
            ev = np.empty(rep.size, dtype=EVENT_DTYPE)
            ev["x"] = pix[rep] % scene.width
            ev["y"] = pix[rep] // scene.width
            ev["t"] = np.floor(t).astype(np.int64)
            ev["p"] = (sign[rep] > 0).astype(np.uint8)
            chunks.append(ev)
            ref[pix] += sign * counts * c
        prev = cur
    chunks.append(_noise(scene, duration_us))
    events = np.concatenate(chunks) if chunks else np.zeros(0, dtype=EVENT_DTYPE)
    return events[np.argsort(events["t"], kind="stable")]


def _noise(scene: SceneSpec, duration_us: int) -> np.ndarray:
    """Seeded background-activity events, uniform in space and time."""
    rng = np.random.default_rng([scene.seed, 0x5EED])
    expected = scene.noise_rate_hz * scene.width * scene.height * duration_us / 1e6
    n = int(rng.poisson(expected))
    ev = np.empty(n, dtype=EVENT_DTYPE)
    ev["x"] = rng.integers(0, scene.width, n)
    ev["y"] = rng.integers(0, scene.height, n)
    ev["t"] = rng.integers(0, duration_us, n)
    ev["p"] = rng.integers(0, 2, n)
    return ev


class SyntheticSource(ArraySource):
    """The built-in scene: events simulated once at construction, RGB rendered on demand.

    Deterministic: the same seed (or the same ``scene``) gives bit-identical events and
    frames. Time starts at 0 µs.
    """

    def __init__(
        self,
        seed: int = 0,
        duration_ms: int = 2000,
        width: int = 96,
        height: int = 72,
        *,
        scene: SceneSpec | None = None,
    ) -> None:
        self.scene = scene or SceneSpec.random(
            seed, width=width, height=height, duration_ms=duration_ms
        )
        events = simulate_events(self.scene)
        log.debug("synthetic scene %s: %d events", self.scene, events.size)
        super().__init__(
            events,
            (self.scene.width, self.scene.height),
            name=f"synthetic:{self.scene.seed}",
            has_rgb=True,
        )

    def describe(self) -> str:
        shapes = ", ".join(s.name or s.kind for s in self.scene.shapes) or "empty"
        return f"{super().describe()}; shapes: {shapes}"

    def time_range_us(self) -> tuple[int, int]:
        # The scene spans its whole duration even if the first/last ms had no events.
        return 0, self.scene.duration_ms * 1000

    def rgb_timestamps_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        check_range(t0_us, t1_us)
        period = 1e6 / self.scene.rgb_fps
        n_frames = int(np.ceil(self.scene.duration_ms * 1000 / period))
        stamps = np.floor(np.arange(n_frames) * period).astype(np.int64)
        inside: np.ndarray = stamps[(stamps >= t0_us) & (stamps < t1_us)]
        return inside

    def rgb_frames_between(self, t0_us: int, t1_us: int) -> list[tuple[int, np.ndarray]]:
        return [
            (int(ts), render_frame(self.scene, int(ts)))
            for ts in self.rgb_timestamps_between(t0_us, t1_us)
        ]
