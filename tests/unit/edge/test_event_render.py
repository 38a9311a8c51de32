"""EventGPT-style rendering: equal-count split, colours, last event wins, CLIP tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eventspec.edge.events.render import event_pixel_values, events_to_frames, split_equal_counts
from eventspec.edge.events.types import make_events
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.imageproc import clip_preprocess

WHITE, BLUE, RED = [255, 255, 255], [0, 0, 255], [255, 0, 0]


def test_split_equal_counts_puts_remainder_last() -> None:
    assert split_equal_counts(12, 5) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 12)]
    assert split_equal_counts(10, 5) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]


def test_frames_split_by_count_not_time() -> None:
    # 10 events: 8 in the first microseconds, 2 much later. Equal-time bins would leave
    # frames empty; equal counts give 2 events per frame.
    t = np.array([0, 1, 2, 3, 4, 5, 6, 7, 90_000, 99_000])
    ev = make_events(np.arange(10), np.zeros(10, int), t, np.ones(10, int))
    frames = events_to_frames(ev, (10, 2), canvas="sensor")
    assert len(frames) == 5
    for i, frame in enumerate(frames):
        assert frame.shape == (2, 10, 3) and frame.dtype == np.uint8
        red = np.flatnonzero(np.all(frame[0] == RED, axis=-1)).tolist()
        assert red == [2 * i, 2 * i + 1]
        assert np.all(frame[1] == WHITE)
    # EventGPT's own canvas: each frame is (y.max+1) x (x.max+1) of its events.
    own = events_to_frames(ev, (10, 2))
    assert [f.shape for f in own] == [(1, 2 * i + 2, 3) for i in range(5)]
    assert all(np.array_equal(o, f[:1, : o.shape[1]]) for o, f in zip(own, frames, strict=True))


def test_colours_and_last_event_wins() -> None:
    # pixel (1,0): ON then OFF -> blue; pixel (2,1): OFF then ON -> red; (0,0) OFF.
    ev = make_events(
        np.array([1, 2, 1, 0, 2]),
        np.array([0, 1, 0, 0, 1]),
        np.arange(5),
        np.array([1, 0, 0, 0, 1]),
    )
    (frame,) = events_to_frames(ev, (3, 2), n_frames=1)
    assert frame[0, 1].tolist() == BLUE
    assert frame[1, 2].tolist() == RED
    assert frame[0, 0].tolist() == BLUE
    assert frame[1, 0].tolist() == WHITE and frame[0, 2].tolist() == WHITE


def test_last_wins_matches_a_python_loop_on_random_events() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    ev = make_events(
        rng.integers(0, 16, n), rng.integers(0, 8, n), np.arange(n), rng.integers(0, 2, n)
    )
    frames = events_to_frames(ev, (16, 8), n_frames=5)
    for k, (a, b) in enumerate(split_equal_counts(n, 5)):
        ref = np.full((8, 16, 3), 255, np.uint8)
        for e in ev[a:b]:
            ref[e["y"], e["x"]] = RED if e["p"] == 1 else BLUE
        assert np.array_equal(frames[k], ref)


def test_pixel_values_shape_and_errors() -> None:
    ev = make_events(np.arange(20) % 8, np.arange(20) % 6, np.arange(20), np.arange(20) % 2)
    pix = event_pixel_values(ev, (8, 6), image_size=28)
    assert pix.shape == (5, 3, 28, 28) and pix.dtype.is_floating_point
    frames = events_to_frames(ev, (8, 6))
    assert torch.equal(pix, clip_preprocess(frames, 28))
    assert not torch.equal(pix[0], pix[1])  # different events per frame
    with pytest.raises(InvalidInput, match="at least 5"):
        events_to_frames(ev[:3], (8, 6))
    with pytest.raises(InvalidInput, match="outside"):
        events_to_frames(ev, (4, 4))
