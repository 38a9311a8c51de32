"""The EventSource role, what the sources share (``FixedSensor``, the sensor-size
precedence of recordings), and an in-memory implementation.

Every source (file, dataset, synthetic, live camera) answers the same four questions:
what it is, how big the sensor is, which time span it covers, and which events/RGB
frames fall in a half-open time range. Windows and rendering only use this protocol,
so they never care where the events came from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from eventspec.edge.events.types import EVENT_DTYPE, sensor_size_of, sort_by_time, validate_events
from eventspec.shared.contract.errors import EventSpecError, InvalidInput, NotFound

log = logging.getLogger(__name__)


@runtime_checkable
class EventSource(Protocol):
    """A time-indexed stream of events, optionally with RGB frames on the same clock.

    All times are absolute microseconds; ranges are half-open ``[t0_us, t1_us)``.
    ``time_range_us()`` is ``(first event t, last event t + 1)``, so
    ``events_between(*time_range_us())`` returns every event.
    """

    @property
    def sensor_size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        ...

    @property
    def has_rgb(self) -> bool:
        """Whether ``rgb_frames_between`` can ever return frames."""
        ...

    def describe(self) -> str:
        """One line for logs and GetStatus."""
        ...

    def time_range_us(self) -> tuple[int, int]:
        """(start, end) of the events held, end exclusive."""
        ...

    def events_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        """Events with ``t0_us <= t < t1_us`` as an EVENT_DTYPE array sorted by t."""
        ...

    def rgb_frames_between(self, t0_us: int, t1_us: int) -> list[tuple[int, np.ndarray]]:
        """(timestamp µs, HxWx3 uint8) frames in the range; [] if the source has no RGB."""
        ...


@dataclass(frozen=True)
class SourceMeta:
    """What a file says about itself, for logs and GetStatus.

    ``size_from`` says where the sensor size came from: ``header geometry``,
    ``header format field``, ``header plugin field``, ``format`` (fixed by the file
    format), ``flag`` (--sensor-size) or ``inferred from events`` (max coordinate + 1).
    ``time_base`` says what t = 0 means and the unit as stored.
    """

    format: str
    size_from: str
    time_base: str


class FixedSensor:
    """``sensor_size`` and ``has_rgb`` as every source answers them: fixed when it opens.

    The base of the sources; each calls :meth:`_fix_sensor` once it knows its size and
    whether it holds RGB frames.
    """

    _sensor_size: tuple[int, int]
    _has_rgb: bool

    def _fix_sensor(self, size: tuple[int, int], *, has_rgb: bool = False) -> None:
        self._sensor_size = (int(size[0]), int(size[1]))
        self._has_rgb = has_rgb

    @property
    def sensor_size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return self._sensor_size

    @property
    def has_rgb(self) -> bool:
        """Whether ``rgb_frames_between`` can ever return frames."""
        return self._has_rgb


def existing_file(path: str | Path) -> Path:
    """``path`` as a Path, or NotFound (nothing there) / InvalidInput (not a regular file),
    naming it: every file reader checks this before it opens anything."""
    p = Path(path)
    if not p.exists():
        raise NotFound(f"event file {p} does not exist")
    if not p.is_file():
        raise InvalidInput(f"event file {p} is not a regular file")
    return p


@contextmanager
def reading(path: Path | str, what: str) -> Iterator[None]:
    """Name the file in every failure while a reader reads it (issue 38, red-team 7).

    Why at each reader's door: zipfile, zlib and numpy speak of bytes, not files ("File
    is not a zip file", "Error -3 while decompressing data", "array is too big"), and a
    reader is also used without ``open_source`` (whose net names the file as well): by
    tools, tests, and every window read after opening. Anything else raised inside
    becomes InvalidInput "FILE: could not read it as WHAT: Type: message"; an
    InvalidInput that does not name the file gets it as a prefix.
    """
    name = Path(path).name
    try:
        yield
    except InvalidInput as exc:
        if name in str(exc):
            raise
        raise InvalidInput(f"{path}: {exc}") from exc
    except EventSpecError:
        raise
    except Exception as exc:  # the file's fault: a damaged file reaches any library path
        raise InvalidInput(
            f"{path}: could not read it as {what}: {type(exc).__name__}: {str(exc)[:300]}"
        ) from exc


def recorded_sensor_size(
    path: Path,
    from_header: tuple[tuple[int, int], str] | None,
    flag: tuple[int, int] | None,
    events_reach: tuple[int, int],
    *,
    hint: str = "",
) -> tuple[tuple[int, int], str]:
    """A recording's sensor size and where it came from (``SourceMeta.size_from``): the
    file's header, else the ``--sensor-size`` flag, else the events (max coordinate + 1).

    ``events_reach`` is the events' (max x, max y); InvalidInput when they fall outside
    the size chosen, with ``hint`` appended to say what may be wrong.
    """
    max_x, max_y = events_reach
    if from_header is not None:
        size, size_from = from_header
    elif flag is not None:
        size, size_from = flag, "flag"
    else:
        size, size_from = (max_x + 1, max_y + 1), "inferred from events"
    if max_x >= size[0] or max_y >= size[1]:
        raise InvalidInput(
            f"{path}: events reach ({max_x}, {max_y}), outside the {size[0]}x{size[1]} "
            f"sensor from the {size_from}{hint}"
        )
    return (int(size[0]), int(size[1])), size_from


def describe_recording(label: str, num_events: int, sensor_size: tuple[int, int],
                       meta: SourceMeta, time_range_us: tuple[int, int]) -> str:
    """The one-line summary of a recorded event source, the same for every file format:
    ``label (N events, WxH [where the size came from], seconds, t: clock)``."""
    t0, t1 = time_range_us
    w, h = sensor_size
    return (
        f"{label} ({num_events} events, {w}x{h} [{meta.size_from}], "
        f"{(t1 - t0) / 1e6:.3f} s, t: {meta.time_base})"
    )


@runtime_checkable
class RgbIndex(Protocol):
    """Optional extension: list frame timestamps without decoding the frames.

    ``sample_rgb_frames`` uses it when present so that picking 8 of 20 DSEC frames
    decodes 8 PNGs, not 20.
    """

    def rgb_timestamps_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        """int64 timestamps (µs) of the frames in ``[t0_us, t1_us)``, ascending."""
        ...


def check_range(t0_us: int, t1_us: int) -> None:
    """Reject inverted ranges; an empty range (t0 == t1) is allowed and yields nothing."""
    if t1_us < t0_us:
        raise InvalidInput(f"time range is inverted: [{t0_us}, {t1_us}) µs")


class ArraySource(FixedSensor):
    """Events held in memory, sorted by t; windows are two binary searches.

    Base of the file sources and the synthetic scene. The array is made read-only so a
    window handed to a caller (a view, not a copy) cannot corrupt the source.
    """

    def __init__(
        self,
        events: np.ndarray,
        sensor_size: tuple[int, int] | None = None,
        *,
        name: str = "array",
        meta: SourceMeta | None = None,
        has_rgb: bool = False,
    ) -> None:
        if events.dtype != EVENT_DTYPE:
            raise InvalidInput(f"events must have dtype {EVENT_DTYPE}, got {events.dtype}")
        if events.size == 0:
            raise InvalidInput(f"{name}: holds no events")
        sorted_ev = sort_by_time(events)
        if sorted_ev is not events:
            log.info("%s: events were not time-ordered; sorted %d events", name, events.size)
        size = sensor_size if sensor_size is not None else sensor_size_of(sorted_ev)
        try:
            validate_events(sorted_ev, size)
        except InvalidInput as exc:  # the array's checks cannot name the file; we can
            raise InvalidInput(f"{name}: {exc}") from exc
        self._events = np.ascontiguousarray(sorted_ev)
        self._events.flags.writeable = False
        self._fix_sensor(size, has_rgb=has_rgb)
        self._name = name
        self.meta = meta or SourceMeta(
            "array", "given" if sensor_size is not None else "inferred from events", "µs"
        )

    @property
    def num_events(self) -> int:
        return int(self._events.size)

    def describe(self) -> str:
        return describe_recording(self._name, self.num_events, self._sensor_size, self.meta,
                                  self.time_range_us())

    def time_range_us(self) -> tuple[int, int]:
        t = self._events["t"]
        return int(t[0]), int(t[-1]) + 1

    def events_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        check_range(t0_us, t1_us)
        t = self._events["t"]
        lo, hi = np.searchsorted(t, [t0_us, t1_us], side="left")
        return self._events[int(lo) : int(hi)]

    def rgb_frames_between(self, t0_us: int, t1_us: int) -> list[tuple[int, np.ndarray]]:
        check_range(t0_us, t1_us)
        return []
