"""Live event streams: a bounded ring buffer filled by a background reader thread.

A camera produces events whether or not anyone asks a question, and a question is
always about the most recent moment. So the edge keeps only the newest
``capacity`` events: when full, the OLDEST are dropped (never the newest, never
blocking the camera), and counters make the loss visible in GetStatus.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from eventspec.edge.events.base import FixedSensor, check_range
from eventspec.edge.events.types import EVENT_DTYPE, coerce_events, sort_by_time, validate_events
from eventspec.shared.contract.errors import InvalidInput, Unavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BufferStats:
    """Counters since creation. ``received == buffered + dropped`` always holds."""

    received: int
    dropped: int  # overflowed (oldest first) plus late
    late: int  # arrived with t before the newest buffered event; discarded
    buffered: int


class LiveEventBuffer:
    """Thread-safe ring buffer of EVENT_DTYPE events, ordered by t, dropping the oldest.

    Storage is one preallocated array; a window query copies only the window.
    """

    def __init__(self, capacity_events: int) -> None:
        if capacity_events <= 0:
            raise InvalidInput(f"buffer capacity must be positive, got {capacity_events}")
        self._buf = np.zeros(capacity_events, dtype=EVENT_DTYPE)
        self._cap = capacity_events
        self._start = 0  # index of the oldest event
        self._size = 0
        self._last_t: int | None = None
        self._lock = threading.Lock()
        self._received = 0
        self._dropped = 0
        self._late = 0

    @property
    def capacity(self) -> int:
        return self._cap

    @property
    def received(self) -> int:
        return self._received

    @property
    def dropped(self) -> int:
        return self._dropped

    @property
    def buffered(self) -> int:
        return self._size

    def stats(self) -> BufferStats:
        with self._lock:
            return BufferStats(self._received, self._dropped, self._late, self._size)

    def push(self, batch: np.ndarray) -> None:
        """Append a batch (EVENT_DTYPE). Events older than the newest held are discarded
        as late, so the buffer stays sorted and windows stay binary searches."""
        batch = sort_by_time(coerce_events(batch))
        with self._lock:
            self._received += batch.size
            if self._last_t is not None and batch.size:
                late = batch["t"] < self._last_t
                n_late = int(late.sum())
                if n_late:
                    self._late += n_late
                    self._dropped += n_late
                    batch = batch[~late]
            k = batch.size
            if k == 0:
                return
            if k >= self._cap:
                self._dropped += self._size + (k - self._cap)
                self._buf[:] = batch[k - self._cap :]
                self._start, self._size = 0, self._cap
            else:
                overflow = self._size + k - self._cap
                if overflow > 0:
                    self._start = (self._start + overflow) % self._cap
                    self._size -= overflow
                    self._dropped += overflow
                end = (self._start + self._size) % self._cap
                first = min(k, self._cap - end)
                self._buf[end : end + first] = batch[:first]
                self._buf[: k - first] = batch[first:]
                self._size += k
            self._last_t = int(batch["t"][-1])

    def time_range_us(self) -> tuple[int, int] | None:
        """(oldest t, newest t + 1) of the buffered events, or None when empty."""
        with self._lock:
            if self._size == 0:
                return None
            oldest = int(self._buf["t"][self._start])
            newest = int(self._buf["t"][(self._start + self._size - 1) % self._cap])
            return oldest, newest + 1

    def events_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        """Copy of the buffered events with ``t0_us <= t < t1_us``."""
        check_range(t0_us, t1_us)
        with self._lock:
            parts = []
            for seg in self._segments():
                t = seg["t"]
                lo, hi = np.searchsorted(t, [t0_us, t1_us], side="left")
                if hi > lo:
                    parts.append(seg[int(lo) : int(hi)])
            if not parts:
                return np.zeros(0, dtype=EVENT_DTYPE)
            return np.concatenate(parts)  # copies, so the ring can move on

    def snapshot(self) -> np.ndarray:
        """Copy of everything buffered, oldest first."""
        with self._lock:
            segs = self._segments()
            return np.concatenate(segs) if segs else np.zeros(0, dtype=EVENT_DTYPE)

    def _segments(self) -> list[np.ndarray]:
        """The buffered events as at most two sorted views, oldest first (lock held)."""
        if self._size == 0:
            return []
        end = self._start + self._size
        if end <= self._cap:
            return [self._buf[self._start : end]]
        return [self._buf[self._start :], self._buf[: end - self._cap]]


class EventReader(Protocol):
    """A camera driver adapter: ``read`` returns the next batch (may be empty), or None
    at end of stream; ``close`` unblocks a pending ``read`` and releases the device."""

    def read(self) -> np.ndarray | None: ...

    def close(self) -> None: ...


class ReplayReader:
    """Test double: replays a recorded event array in fixed-size batches, then ends."""

    def __init__(self, events: np.ndarray, batch_size: int = 1024) -> None:
        if batch_size <= 0:
            raise InvalidInput(f"batch size must be positive, got {batch_size}")
        self._events = coerce_events(events)
        self._batch = batch_size
        self._pos = 0
        self._closed = threading.Event()

    def read(self) -> np.ndarray | None:
        if self._closed.is_set() or self._pos >= self._events.size:
            return None
        batch = self._events[self._pos : self._pos + self._batch]
        self._pos += batch.size
        return batch

    def close(self) -> None:
        self._closed.set()


class LiveSource(FixedSensor):
    """An EventSource over a LiveEventBuffer that a background thread keeps filling.

    Batches that fail validation (coordinates off the sensor, bad polarity) are logged
    and counted in ``invalid`` instead of killing the reader thread.
    """

    def __init__(
        self,
        reader: EventReader,
        capacity: int,
        sensor_size: tuple[int, int],
        *,
        name: str = "live",
        idle_sleep_s: float = 0.001,
        autostart: bool = True,
        max_wait_s: float = 2.0,
    ) -> None:
        self._reader = reader
        self._fix_sensor(sensor_size)
        self.buffer = LiveEventBuffer(capacity)
        self._name = name
        self._idle_sleep_s = idle_sleep_s
        self.max_wait_s = max_wait_s
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._finished = False
        self.invalid = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"{name}-reader", daemon=True)
        if autostart:
            self.start()

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the reader thread (idempotent)."""
        if not self._thread.is_alive() and not self._finished:
            self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the reader thread and close the reader."""
        self._stop.set()
        try:
            self._reader.close()
        finally:
            if self._thread.is_alive():
                self._thread.join(timeout_s)

    def __enter__(self) -> LiveSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def finished(self) -> bool:
        """True once the reader signalled end of stream (or failed)."""
        return self._finished

    def wait_for(self, min_received: int | None = None, timeout_s: float = 5.0) -> bool:
        """Block until ``min_received`` events arrived (or the stream ended, if None).

        Returns whether the condition held before the timeout.
        """

        def done() -> bool:
            if min_received is None:
                return self._finished
            return self.buffer.received >= min_received or self._finished

        with self._cond:
            return self._cond.wait_for(done, timeout_s) and (
                min_received is None or self.buffer.received >= min_received
            )

    def _span_us(self) -> int:
        rng = self.buffer.time_range_us()
        return 0 if rng is None else rng[1] - rng[0]

    def wait_for_span(self, span_us: int) -> None:
        """Block until the buffer holds ``span_us`` of camera time, at most ``max_wait_s``.

        A question asked right after start-up (or a reconnect) would otherwise see a
        clip shorter than it asked for. Raises Unavailable, naming what is held, when
        the bound passes first or the stream has ended short.
        """
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._span_us() >= span_us or self._finished, self.max_wait_s
            )
        held = self._span_us()
        if not ok or held < span_us:
            raise Unavailable(
                f"{self._name}: holds {held / 1000:.1f} ms of events, the request asks for "
                f"the latest {span_us / 1000:.1f} ms; waited {self.max_wait_s:.1f} s"
                + (" (stream ended)" if self._finished else "")
            )

    def health(self) -> object | None:
        """The reader's stream health (``StreamHealth``) if it reports one."""
        report = getattr(self._reader, "health", None)
        return report() if callable(report) else None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self._reader.read()
                if batch is None:
                    break
                if batch.size == 0:
                    self._stop.wait(self._idle_sleep_s)
                    continue
                try:
                    ev = validate_events(sort_by_time(coerce_events(batch)), self._sensor_size)
                except InvalidInput as exc:
                    self.invalid += int(batch.size)
                    log.warning(
                        "%s: dropped an invalid batch of %d events: %s", self._name, batch.size, exc
                    )
                    continue
                self.buffer.push(ev)
                with self._cond:
                    self._cond.notify_all()
        except Exception as exc:  # a driver failure must surface, not vanish with the thread
            self.error = exc
            log.exception("%s: event reader failed", self._name)
        finally:
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    # -- EventSource ---------------------------------------------------------------------

    def describe(self) -> str:
        s = self.buffer.stats()
        w, h = self._sensor_size
        state = "ended" if self._finished else "running"
        return (
            f"{self._name} ({w}x{h}, {state}; buffered {s.buffered}/{self.buffer.capacity}, "
            f"received {s.received}, dropped {s.dropped}, invalid {self.invalid})"
        )

    def time_range_us(self) -> tuple[int, int]:
        rng = self.buffer.time_range_us()
        if rng is None:
            raise InvalidInput(f"{self._name}: no events received yet")
        return rng

    def events_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        return self.buffer.events_between(t0_us, t1_us)

    def rgb_frames_between(self, t0_us: int, t1_us: int) -> list[tuple[int, np.ndarray]]:
        check_range(t0_us, t1_us)
        return []
