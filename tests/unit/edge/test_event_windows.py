"""Clip/event windows, RGB frame sampling and the minimum-events rule."""

from __future__ import annotations

import numpy as np
import pytest

from eventspec.edge.events.base import ArraySource
from eventspec.edge.events.synthetic import SyntheticSource
from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.edge.events.windows import (
    MIN_EVENTS,
    ClipWindow,
    events_for_window,
    sample_rgb_frames,
    select_window,
)
from eventspec.shared.contract.errors import InvalidInput


@pytest.fixture(scope="module")
def synth() -> SyntheticSource:
    return SyntheticSource(3, duration_ms=1500)


class FramesOnly(ArraySource):
    """A source whose RGB has no timestamp index (exercises the fallback path)."""

    def __init__(self, stamps: list[int]) -> None:
        ev = np.zeros(2, dtype=EVENT_DTYPE)
        ev["t"] = [0, 10_000_000]
        super().__init__(ev, (4, 4))
        self.stamps = stamps

    @property
    def has_rgb(self) -> bool:
        return True

    def rgb_frames_between(self, t0_us: int, t1_us: int) -> list[tuple[int, np.ndarray]]:
        return [
            (ts, np.full((2, 2, 3), i, np.uint8))
            for i, ts in enumerate(self.stamps)
            if t0_us <= ts < t1_us
        ]


def test_latest_window_takes_the_last_ms(synth: SyntheticSource) -> None:
    w = select_window(synth, latest_ms=1000)
    assert w == ClipWindow(500_000, 1_500_000, 1_450_000, 1_500_000)
    assert (w.clip_ms, w.event_ms) == (1000.0, 50.0)
    w = select_window(synth, t0_us=100_000, t1_us=400_000, event_window_ms=20)
    assert (w.event_t0_us, w.event_t1_us) == (380_000, 400_000)
    assert select_window(synth).clip_ms == 1000.0  # the default clip


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"latest_ms": 1000, "event_window_ms": 100}, "EventGPT refuses"),
        ({"latest_ms": 1000, "event_window_ms": 0}, "event window"),
        ({"latest_ms": 0}, "positive"),
        ({"latest_ms": 30}, "shorter than"),
        ({"t0_us": 300_000, "t1_us": 200_000}, "inverted"),
        ({"t0_us": 300_000, "t1_us": 300_000}, "empty"),
        ({"t0_us": -10, "t1_us": 200_000}, "outside"),
        ({"t0_us": 0, "t1_us": 1_600_000}, "outside"),
        ({"t0_us": 0}, "both"),
        ({"latest_ms": 100, "t0_us": 0, "t1_us": 100_000}, "not both"),
    ],
)
def test_window_errors(synth: SyntheticSource, kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        select_window(synth, **kwargs)


def test_sample_rgb_frames_uniform_nearest(synth: SyntheticSource) -> None:
    w = select_window(synth, latest_ms=1000)
    frames = sample_rgb_frames(synth, w, n=8)
    assert len(frames) == 8 and all(f.shape == (72, 96, 3) for f in frames)
    stamps = synth.rgb_timestamps_between(w.t0_us, w.t1_us)
    targets = np.linspace(w.t0_us, w.t1_us - 1, 8)
    expected = [int(stamps[np.argmin(np.abs(stamps - t))]) for t in targets]
    for frame, ts in zip(frames, expected, strict=True):
        assert np.array_equal(frame, synth.rgb_frames_between(ts, ts + 1)[0][1])


def test_sample_rgb_frames_fallback_and_repeats() -> None:
    src = FramesOnly([100, 900_000])
    w = ClipWindow(0, 1_000_000, 950_000, 1_000_000)
    frames = sample_rgb_frames(src, w, n=4)
    assert [int(f[0, 0, 0]) for f in frames] == [0, 0, 1, 1]


def test_sample_rgb_frames_errors(synth: SyntheticSource) -> None:
    with pytest.raises(InvalidInput, match="no RGB frames"):
        sample_rgb_frames(FramesOnly([]), ClipWindow(0, 1000, 500, 1000))
    ev = np.zeros(2, dtype=EVENT_DTYPE)
    ev["t"] = [0, 1_000_000]
    with pytest.raises(InvalidInput, match="aligned features"):
        sample_rgb_frames(ArraySource(ev, (4, 4)), ClipWindow(0, 1000, 500, 1000))


def test_events_for_window(synth: SyntheticSource) -> None:
    w = select_window(synth, latest_ms=1000)
    ev = events_for_window(synth, w)
    assert ev.size >= MIN_EVENTS
    assert ev["t"].min() >= w.event_t0_us and ev["t"].max() < w.event_t1_us
    with pytest.raises(InvalidInput, match="need at least"):
        events_for_window(synth, w, min_events=10**9)
    empty = ArraySource(np.zeros(1, dtype=EVENT_DTYPE), (4, 4))
    with pytest.raises(InvalidInput, match="no events"):
        events_for_window(empty, ClipWindow(10, 200_000, 150_000, 200_000))


def test_default_clip_uses_a_short_recording_whole() -> None:
    short = SyntheticSource(seed=1, duration_ms=600)
    w = select_window(short)
    s0, s1 = short.time_range_us()
    assert (w.t0_us, w.t1_us) == (s0, s1)
    assert w.event_t1_us == s1 and w.event_ms == 50
    # An explicit clip longer than the recording falls back to it whole as well.
    for latest_ms in (601, 1000, 2**31 - 1):
        w = select_window(short, latest_ms=latest_ms)
        assert (w.t0_us, w.t1_us, w.event_t1_us) == (s0, s1, s1) and w.event_ms == 50
    w = select_window(short, latest_ms=599)
    assert (w.t0_us, w.t1_us) == (s1 - 599_000, s1)


def test_whole_recording_shorter_than_the_event_window_is_the_event_window() -> None:
    tiny = SyntheticSource(seed=1, duration_ms=30)
    s0, s1 = tiny.time_range_us()
    for latest_ms in (None, 31, 5000):
        w = select_window(tiny, latest_ms=latest_ms)
        assert (w.t0_us, w.t1_us, w.event_t0_us, w.event_t1_us) == (s0, s1, s0, s1)
    with pytest.raises(InvalidInput, match="shorter than"):
        select_window(tiny, latest_ms=20)
