"""ToySource: toy scenes played back to back through the edge's ordinary source path."""

from __future__ import annotations

import numpy as np
import pytest

from eventspec.edge.events.render import events_to_frames
from eventspec.edge.events.sources import open_source
from eventspec.edge.events.toy import TOY_SCENE_US, ToySource
from eventspec.edge.events.types import EVENT_DTYPE, validate_events
from eventspec.edge.events.windows import (
    MIN_EVENTS,
    events_for_window,
    sample_rgb_frames,
    select_window,
)
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.toyworld.events import TOY_EVENT_DTYPE, events_in_window, simulate_events
from eventspec.shared.toyworld.scenes import DEMO_SEED, SPLITS, clip_frames, sample_scene

TEST_SEEDS = range(SPLITS["test"].start, SPLITS["test"].start + 6)


def test_toy_event_dtype_matches_the_edge() -> None:
    assert TOY_EVENT_DTYPE == EVENT_DTYPE


def test_covers_its_scenes_back_to_back_with_rgb() -> None:
    src = ToySource(TEST_SEEDS)
    assert src.has_rgb and src.sensor_size == (64, 64)
    assert src.time_range_us() == (0, 6 * TOY_SCENE_US)
    assert "1010000..1010005" in src.describe()


def test_each_clip_sees_exactly_its_scene() -> None:
    src = ToySource(TEST_SEEDS)
    for i, seed in enumerate(TEST_SEEDS):
        scene = sample_scene(seed)
        assert src.scene_at(i * TOY_SCENE_US + 123) == scene
        window = select_window(src, t0_us=i * TOY_SCENE_US, t1_us=(i + 1) * TOY_SCENE_US)
        frames = sample_rgb_frames(src, window)
        expected = clip_frames(scene)
        assert len(frames) == 8
        for got, want in zip(frames, expected, strict=True):
            assert np.array_equal(got, want)
        # The clip's 8 frames are 8 distinct source frames (none repeated or skipped).
        stamps = src.rgb_timestamps_between(window.t0_us, window.t1_us)
        assert len(stamps) == 8
        events = events_for_window(src, window)
        want_ev = events_in_window(simulate_events(scene), 950_000, 1_000_000)
        assert np.array_equal(events["t"], want_ev["t"] + i * TOY_SCENE_US)
        assert np.array_equal(events[["x", "y", "p"]], want_ev[["x", "y", "p"]])
        assert events.size >= MIN_EVENTS
        validate_events(events, src.sensor_size)
        events_to_frames(events, src.sensor_size)  # renders as EventGPT input


def test_latest_clip_is_the_last_scene() -> None:
    src = ToySource(TEST_SEEDS)
    window = select_window(src)
    assert (window.t0_us, window.t1_us) == (5 * TOY_SCENE_US, 6 * TOY_SCENE_US)
    frames = sample_rgb_frames(src, window)
    assert np.array_equal(frames[-1], clip_frames(sample_scene(TEST_SEEDS[-1]))[-1])


def test_events_across_scenes_are_sorted_and_complete() -> None:
    src = ToySource(TEST_SEEDS[:3])
    every = src.events_between(*src.time_range_us())
    validate_events(every, src.sensor_size)
    per_scene = sum(simulate_events(sample_scene(s)).size for s in TEST_SEEDS[:3])
    assert every.size == per_scene
    straddle = src.events_between(TOY_SCENE_US - 10_000, TOY_SCENE_US + 10_000)
    assert straddle["t"].min() < TOY_SCENE_US <= straddle["t"].max()
    assert src.events_between(5, 5).size == 0
    assert src.events_between(10 * TOY_SCENE_US, 11 * TOY_SCENE_US).size == 0
    with pytest.raises(InvalidInput):
        src.events_between(10, 5)


def test_returned_data_is_read_only_and_cache_is_bounded() -> None:
    src = ToySource(range(0, 8))
    window = src.events_between(0, 50_000)
    with pytest.raises(ValueError):
        window["x"][0] = 1
    for i in range(8):
        src.rgb_frames_between(i * TOY_SCENE_US, i * TOY_SCENE_US + 1)
    assert len(src._cache) <= 4
    # Evicted scenes come back identical.
    again = ToySource(range(0, 8)).events_between(0, 50_000)
    assert np.array_equal(src.events_between(0, 50_000), again)


def test_still_scene_still_answers() -> None:
    seed = next(s for s in SPLITS["test"] if sample_scene(s).motion == "still")
    src = ToySource([seed])
    events = events_for_window(src, select_window(src))
    assert events.size >= MIN_EVENTS


def test_open_source_specs() -> None:
    demo = open_source("toy")
    assert isinstance(demo, ToySource) and list(demo.seeds) == [DEMO_SEED]
    one = open_source("toy:42")
    assert isinstance(one, ToySource) and list(one.seeds) == [42]
    many = open_source("toy:10-13")
    assert isinstance(many, ToySource) and list(many.seeds) == [10, 11, 12]
    assert many.time_range_us() == (0, 3 * TOY_SCENE_US)
    huge = open_source("TOY:0-1000000")  # lazy: nothing is simulated up front
    assert isinstance(huge, ToySource) and huge.time_range_us()[1] == 10**12
    for bad in ("toy:x", "toy:5-5", "toy:7-3", "toy:-1", "toy:1-2-3"):
        with pytest.raises(InvalidInput):
            open_source(bad)
    assert open_source("synthetic:3").sensor_size == (96, 72)  # existing specs still work
