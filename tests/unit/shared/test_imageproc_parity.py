"""Preprocessing parity with the reference models' own processors.

* The cloud's 224-px path (``clip_preprocess`` on what the edge sends) against
  transformers' ``VideoLlavaImageProcessor`` on the original frames.
* The edge's 336-px path against the ``CLIPImageProcessor`` EventGPT calls.
* The event rendering against a literal port of EventGPT's ``common/common.py``.

Sizes: the sensors that matter (DSEC/Gen3 640x480, DAVIS346 346x260, DVXplorer
320x240, Gen4 1280x720) plus a portrait and an already-small frame.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.edge.events.render import events_to_frames, split_equal_counts
from eventspec.edge.events.types import make_events
from eventspec.shared.node.imageproc import (
    clip_preprocess,
    decode_image,
    downscale_short_side,
    encode_jpeg,
    encode_png,
)

transformers = pytest.importorskip("transformers")
SIZES = [(640, 480), (346, 260), (320, 240), (1280, 720), (480, 640), (200, 150)]
#: JPEG at quality 90 moves CLIP-normalised values by this much on average on the
#: noisy, sharp-edged scenes below (measured mean 0.044-0.068; the max, 1.5-2.1, sits on
#: saturated colour edges, where 4:2:0 chroma subsampling smears). The rest of the
#: path is exact, so this is the whole tolerance.
JPEG_Q90_MEAN = 0.1


@pytest.fixture(scope="module")
def video_llava() -> object:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return transformers.VideoLlavaImageProcessor()


@pytest.fixture(scope="module")
def clip336() -> object:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return transformers.CLIPImageProcessor(
        size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}
    )


def scene(width: int, height: int, seed: int) -> np.ndarray:
    """A frame with smooth gradients, hard edges and sensor noise: [H, W, 3] uint8."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    img = np.stack([xx * 255 / width, yy * 255 / height, (xx + yy) % 256], axis=-1)
    for _ in range(6):  # rectangles with sharp borders
        x0, y0 = rng.integers(0, width), rng.integers(0, height)
        img[y0 : y0 + height // 4, x0 : x0 + width // 5] = rng.integers(0, 256, 3)
    img = img + rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def reference_video(proc: object, frames: list[np.ndarray]) -> np.ndarray:
    """Video-LLaVA's per-frame transform. transformers 5.23 moved videos to
    ``VideoLlavaVideoProcessor``, which needs torchvision; its frames get the same
    resize / crop / rescale / normalise as images, which this processor applies."""
    out = proc(images=frames, return_tensors="np",  # type: ignore[operator]
               return_legacy_image_output=False)
    return np.asarray(out["pixel_values"])  # [F, 3, 224, 224]


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_cloud_224_equals_video_llava_processor(video_llava: object, width: int,
                                                height: int) -> None:
    frames = [scene(width, height, seed) for seed in range(3)]
    ref = reference_video(video_llava, frames)
    ours = clip_preprocess(frames, 224).numpy()  # [F, 3, 224, 224]
    assert ours.shape == ref.shape == (3, 3, 224, 224)
    assert float(np.abs(ours - ref).max()) <= 1e-5


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_edge_to_cloud_path_differs_by_jpeg_alone(video_llava: object, width: int,
                                                  height: int) -> None:
    """Edge: downscale to the tower's short side, encode. Cloud: decode, preprocess.
    Lossless coding gives the reference exactly; JPEG q90 adds only its own error."""
    frames = [scene(width, height, seed) for seed in (7, 8)]
    ref = reference_video(video_llava, frames)
    sent_png = [decode_image(encode_png(downscale_short_side(f, 224))) for f in frames]
    assert float(np.abs(clip_preprocess(sent_png, 224).numpy() - ref).max()) <= 1e-5
    sent_jpeg = [decode_image(encode_jpeg(downscale_short_side(f, 224), 90)) for f in frames]
    ours = clip_preprocess(sent_jpeg, 224).numpy()
    # What the cloud does to the JPEG is exactly what the reference does to it ...
    assert float(np.abs(ours - reference_video(video_llava, sent_jpeg)).max()) <= 1e-5
    # ... so the distance to the reference on the original is the JPEG's alone.
    assert float(np.abs(ours - ref).mean()) <= JPEG_Q90_MEAN


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_edge_336_equals_eventgpt_clip_processor(clip336: object, width: int,
                                                 height: int) -> None:
    rng = np.random.default_rng(width)
    n = 30_000
    ev = make_events(rng.integers(0, width, n), rng.integers(0, height, n),
                     np.arange(n), rng.integers(0, 2, n))
    frames = events_to_frames(ev, (width, height))
    ref = np.stack([clip336(f, return_tensors="np")["pixel_values"][0]  # type: ignore[operator]
                    for f in frames])
    ours = clip_preprocess(frames, 336).numpy()  # [5, 3, 336, 336]
    assert ours.shape == ref.shape == (5, 3, 336, 336)
    assert float(np.abs(ours - ref).max()) <= 1e-5


def eventgpt_reference_frames(x: np.ndarray, y: np.ndarray, p: np.ndarray) -> list[np.ndarray]:
    """EventGPT ``common/common.py``: get_event_images_list(.., 5) + generate_event_image,
    ported line for line (a Python loop; the last event at a pixel wins)."""
    total = len(x)
    per = total // 5
    out = []
    for i in range(5):
        a, b = i * per, (i + 1) * per if i < 4 else total
        xs, ys, ps = x[a:b], y[a:b], p[a:b]
        img = np.ones((int(ys.max()) + 1, int(xs.max()) + 1, 3), dtype=np.uint8) * 255
        for x_, y_, p_ in zip(xs, ys, ps, strict=True):
            img[y_, x_] = np.array([0, 0, 255]) if p_ == 0 else np.array([255, 0, 0])
        out.append(img)
    return out


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(5, 400),
    width=st.integers(1, 64),
    height=st.integers(1, 48),
    seed=st.integers(0, 2**32 - 1),
)
def test_rendering_equals_eventgpt(n: int, width: int, height: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, width, n), rng.integers(0, height, n)
    p = rng.integers(0, 2, n)
    ev = make_events(x, y, np.sort(rng.integers(0, 90_000, n)), p)
    ours = events_to_frames(ev, (width, height))
    ref = eventgpt_reference_frames(ev["x"], ev["y"], ev["p"])
    assert len(ours) == 5
    for a, b in zip(ours, ref, strict=True):
        assert a.shape == b.shape and np.array_equal(a, b)
    assert [b - a for a, b in split_equal_counts(n, 5)][:4] == [n // 5] * 4
