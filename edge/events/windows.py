"""Choosing what each model looks at: a clip for Video-LLaVA, an event window for EventGPT.

The two models read different spans of one moment: Video-LLaVA samples 8 RGB frames
over a clip (about a second), while EventGPT's original code refuses event windows of
100 ms or more. A request names the clip; the event window is the clip's last
``event_window_ms`` (50 ms by default), i.e. the freshest events, which is what a
question about "now" is about.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from eventspec.edge.events.base import EventSource, RgbIndex
from eventspec.shared.contract.errors import InvalidInput

#: EventGPT refuses event windows of this length or longer (common.py in the original).
MAX_EVENT_WINDOW_MS = 100
DEFAULT_EVENT_WINDOW_MS = 50
#: Clip length used when a request names neither ``latest_ms`` nor a range.
DEFAULT_CLIP_MS = 1000
#: Fewer events than this in the event window render five nearly empty frames.
MIN_EVENTS = 100
#: Frames EventGPT draws per window (``eventspec.edge.events.render`` re-exports it).
EVENTGPT_N_FRAMES = 5


@runtime_checkable
class SpanWaiter(Protocol):
    """Live sources: block (up to their own bound) until ``span_us`` of data is held."""

    def wait_for_span(self, span_us: int) -> None: ...


@dataclass(frozen=True)
class ClipWindow:
    """Half-open µs ranges: the RGB clip ``[t0_us, t1_us)`` and the event window inside it."""

    t0_us: int
    t1_us: int
    event_t0_us: int
    event_t1_us: int

    @property
    def clip_ms(self) -> float:
        return (self.t1_us - self.t0_us) / 1000.0

    @property
    def event_ms(self) -> float:
        return (self.event_t1_us - self.event_t0_us) / 1000.0


def select_window(
    source: EventSource,
    *,
    latest_ms: int | None = None,
    t0_us: int | None = None,
    t1_us: int | None = None,
    event_window_ms: int = DEFAULT_EVENT_WINDOW_MS,
) -> ClipWindow:
    """The clip is the source's latest ``latest_ms`` or ``[t0_us, t1_us)``; the event
    window is its last ``event_window_ms``.

    The rule (the README states it): with neither given the clip is the latest
    ``DEFAULT_CLIP_MS``. A latest-N clip longer than what the source holds is the whole
    recording, whether N was asked for or not. When the clip is the whole recording and
    is shorter than the event window, the event window is the whole recording too. An
    explicit range must lie inside the source and hold the event window. Raises
    InvalidInput for an event window outside (0, 100) ms (EventGPT refuses 100 ms or
    more), a non-positive latest_ms, a clip shorter than the event window, and
    inverted, empty or outside ranges.
    """
    if not 0 < event_window_ms < MAX_EVENT_WINDOW_MS:
        raise InvalidInput(
            f"event window must be in (0, {MAX_EVENT_WINDOW_MS}) ms (EventGPT refuses "
            f"{MAX_EVENT_WINDOW_MS} ms or more), got {event_window_ms} ms"
        )
    if isinstance(source, SpanWaiter) and t0_us is None and t1_us is None:
        # A live source that has not yet recorded the clip gets a bounded wait; its
        # clip is always the latest N ms of the camera's clock.
        latest_ms = DEFAULT_CLIP_MS if latest_ms is None else latest_ms
        if latest_ms > 0:
            source.wait_for_span(latest_ms * 1000)
    s0, s1 = source.time_range_us()
    if latest_ms is not None and (t0_us is not None or t1_us is not None):
        raise InvalidInput("give either latest_ms or t0_us/t1_us, not both")
    if (t0_us is None) != (t1_us is None):
        raise InvalidInput("a time range needs both t0_us and t1_us")
    whole = False
    if t0_us is None or t1_us is None:
        clip_ms = DEFAULT_CLIP_MS if latest_ms is None else latest_ms
        if clip_ms <= 0:
            raise InvalidInput(f"latest_ms must be positive, got {clip_ms}")
        t1_us = s1
        t0_us = s1 - clip_ms * 1000
        if t0_us <= s0:
            # The source holds less than the clip: the clip is the whole recording.
            t0_us, whole = s0, True
    else:
        if t1_us <= t0_us:
            raise InvalidInput(f"clip range [{t0_us}, {t1_us}) µs is empty or inverted")
        if t0_us < s0 or t1_us > s1:
            raise InvalidInput(
                f"clip range [{t0_us}, {t1_us}) µs lies outside the source's [{s0}, {s1}) µs"
            )
    event_us = event_window_ms * 1000
    if whole and t1_us - t0_us < event_us:
        # The whole recording is shorter than the event window (an 8.8 ms EVT3 sample,
        # a 5-event excerpt): the event window is all of it.
        event_us = t1_us - t0_us
    if t1_us - t0_us < event_us:
        raise InvalidInput(
            f"clip of {(t1_us - t0_us) / 1000:.1f} ms is shorter than the "
            f"{event_window_ms} ms event window"
        )
    return ClipWindow(int(t0_us), int(t1_us), int(t1_us - event_us), int(t1_us))


def sample_rgb_frames(source: EventSource, window: ClipWindow, n: int = 8) -> list[np.ndarray]:
    """``n`` RGB frames spread uniformly over the clip: for each of ``n`` evenly spaced
    instants (first and last included, as Video-LLaVA spaces frame indices), the nearest
    frame inside the clip. Frames repeat when the clip holds fewer than ``n``.
    """
    if n <= 0:
        raise InvalidInput(f"frame count must be positive, got {n}")
    targets = np.linspace(window.t0_us, window.t1_us - 1, n)  # [n] µs
    if isinstance(source, RgbIndex):
        stamps = np.asarray(source.rgb_timestamps_between(window.t0_us, window.t1_us))
        if stamps.size == 0:
            raise _no_rgb(source, window)
        picks = _nearest(stamps, targets)
        frames = {}
        for i in sorted(set(picks.tolist())):
            ts = int(stamps[i])
            got = source.rgb_frames_between(ts, ts + 1)
            if not got:
                raise InvalidInput(f"{source.describe()}: frame at {ts} µs vanished")
            frames[i] = got[0][1]
        return [frames[int(i)] for i in picks]
    pairs = source.rgb_frames_between(window.t0_us, window.t1_us)
    if not pairs:
        raise _no_rgb(source, window)
    stamps = np.asarray([ts for ts, _ in pairs], dtype=np.int64)
    return [pairs[int(i)][1] for i in _nearest(stamps, targets)]


def events_for_window(
    source: EventSource, window: ClipWindow, *, min_events: int = MIN_EVENTS
) -> np.ndarray:
    """The events of the window's event span, or InvalidInput if fewer than ``min_events``.

    A whole recording of a handful of events (the Event Camera Dataset's 5-event sample)
    is refused like any sparse window: five frames of one event each show nothing, and
    an answer about them would be made up.
    """
    events = source.events_between(window.event_t0_us, window.event_t1_us)
    if events.size < min_events:
        what = "no events" if events.size == 0 else f"only {events.size} events"
        raise InvalidInput(
            f"{source.describe()}: {what} in the event window "
            f"[{window.event_t0_us}, {window.event_t1_us}) µs; need at least {min_events}"
        )
    return events


def _nearest(stamps: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Index into ascending ``stamps`` of the nearest stamp to each target (ties: earlier)."""
    right = np.clip(np.searchsorted(stamps, targets, side="left"), 0, len(stamps) - 1)
    left = np.clip(right - 1, 0, len(stamps) - 1)
    pick_left = np.abs(targets - stamps[left]) <= np.abs(stamps[right] - targets)
    return np.where(pick_left, left, right)


def _no_rgb(source: EventSource, window: ClipWindow) -> InvalidInput:
    if not source.has_rgb:
        return InvalidInput(f"{source.describe()} has no RGB frames; use aligned features")
    return InvalidInput(
        f"{source.describe()}: no RGB frames in the clip [{window.t0_us}, {window.t1_us}) µs"
    )
