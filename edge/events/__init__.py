"""Event data on the edge: the internal dtype, sources, windows and rendering."""

from eventspec.edge.events.base import ArraySource, EventSource, RgbIndex
from eventspec.edge.events.dsec import DsecSource
from eventspec.edge.events.live import (
    BufferStats,
    EventReader,
    LiveEventBuffer,
    LiveSource,
    ReplayReader,
)
from eventspec.edge.events.render import event_pixel_values, events_to_frames
from eventspec.edge.events.sources import EventGptNpySource, NpzSource, open_source
from eventspec.edge.events.synthetic import SceneSpec, ShapeSpec, SyntheticSource
from eventspec.edge.events.types import EVENT_DTYPE, coerce_events, make_events, validate_events
from eventspec.edge.events.windows import (
    MAX_EVENT_WINDOW_MS,
    MIN_EVENTS,
    ClipWindow,
    events_for_window,
    sample_rgb_frames,
    select_window,
)

__all__ = [
    "EVENT_DTYPE",
    "MAX_EVENT_WINDOW_MS",
    "MIN_EVENTS",
    "ArraySource",
    "BufferStats",
    "ClipWindow",
    "DsecSource",
    "EventGptNpySource",
    "EventReader",
    "EventSource",
    "LiveEventBuffer",
    "LiveSource",
    "NpzSource",
    "ReplayReader",
    "RgbIndex",
    "SceneSpec",
    "ShapeSpec",
    "SyntheticSource",
    "coerce_events",
    "event_pixel_values",
    "events_for_window",
    "events_to_frames",
    "make_events",
    "open_source",
    "sample_rgb_frames",
    "select_window",
    "validate_events",
]
