"""Events to EventGPT's input images, exactly as its ``common/common.py`` draws them.

EventGPT was trained on event windows split into 5 frames with EQUAL EVENT COUNTS
(``total // n`` per frame, the remainder in the last), each drawn on a white canvas:
polarity 0 blue, polarity 1 red, the last event at a pixel winning. Any drift from
that (time bins, grey canvases, accumulation) feeds the model inputs unlike its
training data. The original loops over events in Python; this is vectorised.

The canvas is EventGPT's: (y.max + 1) x (x.max + 1) of each split's own events
(``canvas="eventgpt"``, the default), so a split that does not reach the sensor's right
or bottom border is drawn on a smaller canvas and then stretched by the CLIP resize,
exactly as in the reference. ``canvas="sensor"`` draws every frame on the full sensor
instead (frames of one window then share a geometry); the embedded toy draft was
trained that way, so it asks for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

from eventspec.edge.events.types import validate_events
from eventspec.edge.events.windows import EVENTGPT_N_FRAMES
from eventspec.shared.contract.errors import InvalidInput

if TYPE_CHECKING:  # torch comes with the preprocessing, when a window is rendered
    import torch

#: "eventgpt": each frame's canvas is its own events' (y.max+1) x (x.max+1);
#: "sensor": the sensor size for every frame.
Canvas = Literal["eventgpt", "sensor"]
BLUE = np.array([0, 0, 255], dtype=np.uint8)  # p = 0
RED = np.array([255, 0, 0], dtype=np.uint8)  # p = 1


def split_equal_counts(n_events: int, n_frames: int) -> list[tuple[int, int]]:
    """[start, end) index ranges: ``n_events // n_frames`` each, remainder in the last."""
    if n_frames <= 0:
        raise InvalidInput(f"frame count must be positive, got {n_frames}")
    per = n_events // n_frames
    return [(i * per, (i + 1) * per if i < n_frames - 1 else n_events) for i in range(n_frames)]


def draw_events(events: np.ndarray, sensor_size: tuple[int, int]) -> np.ndarray:
    """One frame: white [H, W, 3] uint8 canvas, p=0 blue, p=1 red, last event wins."""
    width, height = sensor_size
    canvas = np.full((height * width, 3), 255, dtype=np.uint8)  # [H*W, 3]
    if events.size:
        flat = events["y"].astype(np.int64) * width + events["x"].astype(np.int64)  # [N]
        # NumPy leaves the winner of repeated fancy-index writes unspecified, so pick
        # each pixel's last event explicitly: first occurrence in the reversed order.
        _, first_rev = np.unique(flat[::-1], return_index=True)
        last = events.size - 1 - first_rev  # [P] one event index per touched pixel
        colours = np.where(events["p"][last, None] == 1, RED, BLUE)  # [P, 3]
        canvas[flat[last]] = colours
    return canvas.reshape(height, width, 3)


def events_to_frames(
    events: np.ndarray,
    sensor_size: tuple[int, int],
    n_frames: int = EVENTGPT_N_FRAMES,
    *,
    canvas: Canvas = "eventgpt",
) -> list[np.ndarray]:
    """Split ``events`` (sorted by t) into ``n_frames`` equal-count parts and draw each.

    With ``canvas="eventgpt"`` frame i is [y_i.max+1, x_i.max+1, 3]; with ``"sensor"``
    every frame is [H, W, 3] of ``sensor_size``.
    """
    validate_events(events, sensor_size)
    if events.size < n_frames:
        raise InvalidInput(
            f"need at least {n_frames} events to draw {n_frames} frames, got {events.size}"
        )
    if canvas not in ("eventgpt", "sensor"):
        raise InvalidInput(f"canvas must be 'eventgpt' or 'sensor', got {canvas!r}")
    frames = []
    for a, b in split_equal_counts(events.size, n_frames):
        part = events[a:b]
        size = sensor_size if canvas == "sensor" else (
            int(part["x"].max()) + 1, int(part["y"].max()) + 1
        )
        frames.append(draw_events(part, size))
    return frames


def event_pixel_values(
    events: np.ndarray,
    sensor_size: tuple[int, int],
    image_size: int,
    n_frames: int = EVENTGPT_N_FRAMES,
    *,
    canvas: Canvas = "eventgpt",
) -> torch.Tensor:
    """EventGPT's vision input: CLIP-preprocessed event frames -> float32 [5, 3, S, S].

    The preprocessing (and torch, 1.1 s) is imported here, not with the events package,
    so the edge's start-up checks of ``--source`` answer before any model work."""
    from eventspec.shared.node.imageproc import clip_preprocess

    frames = events_to_frames(events, sensor_size, n_frames, canvas=canvas)
    return clip_preprocess(frames, image_size)


def canvas_for(draft: object) -> Canvas:
    """The canvas ``draft`` was trained on: its config's ``event_canvas`` ("sensor" for
    the embedded toy draft), else EventGPT's own ("eventgpt")."""
    config = getattr(getattr(draft, "model", None), "config", None)
    return "sensor" if getattr(config, "event_canvas", "eventgpt") == "sensor" else "eventgpt"
