"""Toy scenes: one or two bright shapes moving in one direction over a dark background.

The embedded demo models are trained on this world, so it is built to separate what
an event camera can know from what only an RGB camera can:

- **Motion and shape are visible to both.** Objects are always brighter than the
  background, so a moving object's leading edge brightens (ON events) and its
  trailing edge darkens (OFF events); polarity alone tells the direction.
- **Colour is visible to the RGB camera only.** Events carry luminance changes, not
  hue. Object brightness is jittered per scene and backgrounds span a range of
  luminance, so the strength of the events does not give the colour away either.

Geometry is chosen so nothing leaves the frame during the clip (no bouncing): a
bounce would flip the direction mid-clip and make "which way" ambiguous.

Coordinates: x grows to the right, y grows downwards (image rows), so "up" means
decreasing y.

Seed ranges: :data:`SPLITS` holds train / val / test. Acceptance checks of trained
models use seeds at or above :data:`EVAL_SEED_MIN`, which nobody trains or tests on;
the bundled demo scene is seed :data:`DEMO_SEED`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Shape = Literal["circle", "square", "triangle"]
ColourName = Literal["red", "green", "blue", "yellow"]
Motion = Literal["left", "right", "up", "down", "still"]
RGB = tuple[int, int, int]

SHAPES: tuple[Shape, ...] = ("circle", "square", "triangle")
COLOURS: tuple[ColourName, ...] = ("red", "green", "blue", "yellow")
DIRECTIONS: tuple[Motion, ...] = ("left", "right", "up", "down")
MOTIONS: tuple[Motion, ...] = (*DIRECTIONS, "still")

#: Light object colours, each far brighter (luminance 121..214) than any background.
OBJECT_RGB: dict[ColourName, RGB] = {
    "red": (240, 70, 70),
    "green": (80, 220, 80),
    "blue": (90, 130, 255),
    "yellow": (240, 230, 60),
}
#: Per-scene brightness gain on the object colour: decorrelates event contrast from hue.
OBJECT_GAIN_RANGE = (0.85, 1.0)
#: Background hues (unit-less tints), scaled per scene to a dark luminance.
BACKGROUND_TINTS: tuple[tuple[float, float, float], ...] = (
    (1.0, 1.0, 1.0),  # grey
    (0.35, 0.45, 1.0),  # navy
    (0.4, 1.0, 0.5),  # dark green
    (1.0, 0.45, 0.4),  # maroon
    (0.8, 0.45, 1.0),  # purple
    (0.3, 0.9, 0.9),  # teal
    (1.0, 0.75, 0.4),  # brown
)
#: Background luminance before texture; with the texture it stays <= ~34.
BACKGROUND_LUMA_RANGE = (8.0, 30.0)
#: Relative amplitude of the static background texture (a faint sinusoidal grating).
TEXTURE_AMP_MAX = 0.12
#: Every scene's geometry: a 64x64 sensor and a 1 s clip.
SCENE_WIDTH, SCENE_HEIGHT, SCENE_DURATION_US = 64, 64, 1_000_000
SIZE_RANGE_PX = (12.0, 18.0)
SPEED_RANGE_PX_S = (18.0, 30.0)
P_STILL = 0.1
P_TWO_OBJECTS = 0.3
#: Pixels kept free between an object's reach (extent plus anti-aliased rim) and the border.
BORDER_MARGIN_PX = 0.5
N_CLIP_FRAMES = 8

SPLITS: dict[str, range] = {
    "train": range(0, 1_000_000),
    "val": range(1_000_000, 1_010_000),
    "test": range(1_010_000, 1_020_000),
}
#: Seeds from here on are reserved for acceptance checks: never trained or tested on.
EVAL_SEED_MIN = 2_000_000
#: The bundled demo scene (``open_source("toy")``); inside the reserved range on purpose.
DEMO_SEED = 2_000_000


def luminance(rgb: tuple[float, float, float] | np.ndarray) -> float:
    """Rec.601 luma (0.299 R + 0.587 G + 0.114 B), what the event simulator sees."""
    r, g, b = (float(c) for c in rgb)
    return 0.299 * r + 0.587 * g + 0.114 * b


@dataclass(frozen=True)
class ToyObject:
    """One shape moving at constant velocity; position is its centre in pixels.

    ``size_px`` is the shape's width: circle diameter, square side, triangle side (an
    equilateral triangle pointing up, centred on its centroid).
    """

    shape: Shape
    colour: ColourName
    rgb: RGB
    size_px: float
    start_xy: tuple[float, float]
    velocity_px_s: tuple[float, float]

    def centre_at(self, t_us: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Centre (x, y) at ``t_us`` (scalar or array of µs) -> two arrays shaped like t."""
        t_s = np.asarray(t_us, dtype=np.float64) / 1e6
        return (
            self.start_xy[0] + self.velocity_px_s[0] * t_s,
            self.start_xy[1] + self.velocity_px_s[1] * t_s,
        )


@dataclass(frozen=True)
class Texture:
    """Static background grating: ``1 + amplitude * sin(2π (fx x + fy y) / width + phase)``."""

    amplitude: float = 0.0
    freq_x: float = 0.0
    freq_y: float = 0.0
    phase: float = 0.0


@dataclass(frozen=True)
class ToyScene:
    """Everything that determines a toy clip; equal scenes render identical data."""

    seed: int
    objects: tuple[ToyObject, ...]
    motion: Motion
    background_rgb: RGB
    texture: Texture = Texture()
    width: int = SCENE_WIDTH
    height: int = SCENE_HEIGHT
    duration_us: int = SCENE_DURATION_US

    @property
    def count(self) -> int:
        return len(self.objects)


def split_of(seed: int) -> str:
    """The split a seed belongs to: train/val/test, "eval" (reserved) or "unassigned"."""
    for name, seeds in SPLITS.items():
        if seed in seeds:
            return name
    return "eval" if seed >= EVAL_SEED_MIN else "unassigned"


def sample_scene(seed: int) -> ToyScene:
    """The scene of ``seed``: deterministic, see the module docstring for the design."""
    rng = np.random.default_rng(seed)
    width, height, duration_us = SCENE_WIDTH, SCENE_HEIGHT, SCENE_DURATION_US
    motion: Motion = "still" if rng.random() < P_STILL else DIRECTIONS[int(rng.integers(4))]
    n_objects = 2 if rng.random() < P_TWO_OBJECTS else 1
    shape_idx = rng.choice(len(SHAPES), size=n_objects, replace=False)
    sizes = rng.uniform(*SIZE_RANGE_PX, size=n_objects)
    speeds = rng.uniform(*SPEED_RANGE_PX_S, size=n_objects)
    starts = _place(rng, motion, sizes, speeds * duration_us / 1e6, width, height)
    objects = []
    for i in range(n_objects):
        colour = COLOURS[int(rng.integers(len(COLOURS)))]
        gain = float(rng.uniform(*OBJECT_GAIN_RANGE))
        rgb = tuple(round(c * gain) for c in OBJECT_RGB[colour])
        objects.append(
            ToyObject(
                shape=SHAPES[int(shape_idx[i])],
                colour=colour,
                rgb=(rgb[0], rgb[1], rgb[2]),
                size_px=round(float(sizes[i]), 3),
                start_xy=starts[i],
                velocity_px_s=_velocity(motion, float(speeds[i])),
            )
        )
    tint = np.asarray(BACKGROUND_TINTS[int(rng.integers(len(BACKGROUND_TINTS)))])
    bg = tint * (float(rng.uniform(*BACKGROUND_LUMA_RANGE)) / luminance(tint))
    texture = Texture(
        amplitude=round(float(rng.uniform(0.0, TEXTURE_AMP_MAX)), 4),
        freq_x=round(float(rng.uniform(-3.0, 3.0)), 4),
        freq_y=round(float(rng.uniform(-3.0, 3.0)), 4),
        phase=round(float(rng.uniform(0.0, 2.0 * np.pi)), 4),
    )
    return ToyScene(
        seed=seed,
        objects=tuple(objects),
        motion=motion,
        background_rgb=(round(bg[0]), round(bg[1]), round(bg[2])),
        texture=texture,
        width=width,
        height=height,
        duration_us=duration_us,
    )


def _velocity(motion: Motion, speed: float) -> tuple[float, float]:
    vx = {"left": -speed, "right": speed}.get(motion, 0.0)
    vy = {"up": -speed, "down": speed}.get(motion, 0.0)
    return (round(vx, 4), round(vy, 4))


def _place(
    rng: np.random.Generator,
    motion: Motion,
    sizes: np.ndarray,
    travel: np.ndarray,
    width: int,
    height: int,
) -> list[tuple[float, float]]:
    """Start centres so each object stays inside the frame for the whole clip and two
    objects never touch: moving ones sit in separate lanes across the motion, still ones
    in disjoint boxes (rejection sampling, deterministic through ``rng``).
    """
    n = len(sizes)
    along_x = motion in ("left", "right")
    along_extent = width if along_x else height
    across_extent = height if along_x else width
    for _ in range(1000):
        starts: list[tuple[float, float]] = []
        for i in range(n):
            m = _reach(float(sizes[i])) + BORDER_MARGIN_PX
            dist = float(travel[i]) if motion != "still" else 0.0
            if motion in ("left", "up"):
                along = rng.uniform(m + dist, along_extent - m)
            else:
                along = rng.uniform(m, along_extent - m - dist)
            across = rng.uniform(m, across_extent - m)
            xy = (along, across) if along_x or motion == "still" else (across, along)
            starts.append((round(float(xy[0]), 3), round(float(xy[1]), 3)))
        if n == 1 or _apart(starts, sizes, motion):
            return starts
    raise RuntimeError("could not place two non-overlapping objects")  # pragma: no cover


def _apart(starts: list[tuple[float, float]], sizes: np.ndarray, motion: Motion) -> bool:
    gap = _reach(float(sizes[0])) + _reach(float(sizes[1]))  # regions never touch
    dx = abs(starts[0][0] - starts[1][0])
    dy = abs(starts[0][1] - starts[1][1])
    if motion in ("left", "right"):
        return bool(dy >= gap)
    if motion in ("up", "down"):
        return bool(dx >= gap)
    return bool(max(dx, dy) >= gap)


# ---------------------------------------------------------------------------- rendering


def background_image(scene: ToyScene) -> np.ndarray:
    """The static background -> [H, W, 3] float32 in 0..255."""
    h, w = scene.height, scene.width
    tex = scene.texture
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)  # [H, W] each
    grating = 1.0 + tex.amplitude * np.sin(
        2.0 * np.pi * (tex.freq_x * xs + tex.freq_y * ys) / w + tex.phase
    )  # [H, W]
    bg = np.asarray(scene.background_rgb, dtype=np.float32)  # [3]
    out: np.ndarray = (grating[..., None] * bg).astype(np.float32)
    return out


def coverage(obj: ToyObject, t_us: np.ndarray, width: int, height: int) -> np.ndarray:
    """Fraction of each pixel covered by ``obj`` at each time -> [T, H, W] float32 in [0, 1].

    A one-pixel linear ramp across the edge (signed distance + 0.5, clipped) stands in
    for area coverage. Besides smoother frames, it makes a pixel's intensity change over
    the ~25 ms the edge takes to cross it, as a real optical edge does, so several
    contrast crossings per edge spread out in time instead of firing at once.
    """
    xs = np.arange(width, dtype=np.float32)[None, None, :]  # [1, 1, W]
    ys = np.arange(height, dtype=np.float32)[None, :, None]  # [1, H, 1]
    times = np.asarray(t_us, dtype=np.float64).reshape(-1, 1, 1)  # [T, 1, 1]
    return coverage_at(obj, times, xs, ys)


def coverage_at(obj: ToyObject, t_us: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """:func:`coverage` at pixel centres ``xs``, ``ys`` (float32) and times ``t_us``, all
    broadcast together -> float32 in [0, 1] of the broadcast shape.

    The event simulator calls it on just the pixels an object sweeps, which is most of
    the saving when thousands of samples are rendered per scene.
    """
    cx, cy = obj.centre_at(t_us)
    dx = xs - cx.astype(np.float32)
    dy = ys - cy.astype(np.float32)
    half = np.float32(obj.size_px / 2)
    if obj.shape == "circle":
        inside = half - np.sqrt(dx * dx + dy * dy)
    elif obj.shape == "square":
        inside = half - np.maximum(np.abs(dx), np.abs(dy))
    else:
        # Equilateral, apex up, centroid at the centre: inradius = side / (2√3); the edge
        # normals point down, up-right and up-left (y grows downwards).
        r_in = np.float32(obj.size_px / (2.0 * np.sqrt(3.0)))
        c, s = np.float32(np.sqrt(3.0) / 2), np.float32(0.5)
        dist = np.maximum(dy, np.maximum(c * dx - s * dy, -c * dx - s * dy))
        inside = r_in - dist
    alpha: np.ndarray = np.clip(inside + np.float32(0.5), 0.0, 1.0).astype(np.float32)
    return alpha


def reach_px(obj: ToyObject) -> float:
    """Farthest distance from the centre, along x or y, at which ``obj`` touches a pixel."""
    return _reach(obj.size_px)


def _reach(size_px: float) -> float:
    # The triangle's apex (circumradius size/√3) plus its anti-aliasing ramp bounds all
    # three shapes along either axis.
    return size_px / math.sqrt(3.0) + 1.0


def render_rgb(scene: ToyScene, t_us: float) -> np.ndarray:
    """The RGB frame at ``t_us`` -> [H, W, 3] uint8."""
    img = background_image(scene)  # [H, W, 3]
    for obj in scene.objects:
        alpha = coverage(obj, np.asarray([t_us]), scene.width, scene.height)[0]  # [H, W]
        colour = np.asarray(obj.rgb, dtype=np.float32)
        img += alpha[..., None] * (colour - img)
    out: np.ndarray = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return out


def background_luminance(scene: ToyScene) -> np.ndarray:
    """Luma of :func:`background_image` -> [H, W] float32."""
    weights = np.asarray([0.299, 0.587, 0.114], dtype=np.float32)
    luma: np.ndarray = background_image(scene) @ weights
    return luma


def render_luminance(scene: ToyScene, t_us: np.ndarray) -> np.ndarray:
    """Luma at each of ``t_us`` -> [T, H, W] float32 in 0..255 (before any rounding).

    Compositing is linear, so this equals the luma of the float RGB frame: events and
    frames describe the same scene.
    """
    times = np.asarray(t_us, dtype=np.float64).reshape(-1)  # [T]
    bg = background_luminance(scene)  # [H, W]
    img = np.broadcast_to(bg, (times.size, scene.height, scene.width)).copy()  # [T, H, W]
    for obj in scene.objects:
        alpha = coverage(obj, times, scene.width, scene.height)  # [T, H, W]
        img += alpha * (np.float32(luminance(obj.rgb)) - img)
    return img


def rgb_frame_times_us(duration_us: int) -> np.ndarray:
    """The source's RGB frame stamps within one scene -> [8] int64 µs.

    They sit exactly on ``linspace(0, duration - 1, 8)`` (rounded), the instants at
    which the edge samples a clip, so a clip equal to the scene picks each frame once.
    """
    stamps: np.ndarray = np.rint(np.linspace(0, duration_us - 1, N_CLIP_FRAMES)).astype(np.int64)
    return stamps


#: The frame stamps of a default (1 s) scene: 0, 142857, ..., 999999 µs. Read-only.
RGB_FRAME_TIMES_US: np.ndarray = rgb_frame_times_us(SCENE_DURATION_US)
RGB_FRAME_TIMES_US.flags.writeable = False


def clip_frames(scene: ToyScene) -> list[np.ndarray]:
    """The 8 RGB frames the cloud sees for the clip covering the whole scene: [H, W, 3] uint8."""
    return [render_rgb(scene, float(t)) for t in rgb_frame_times_us(scene.duration_us)]
