"""Live ring buffer: drops oldest, counts, stays sorted; LiveSource over a replay reader."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from eventspec.edge.events.live import LiveEventBuffer, LiveSource, ReplayReader
from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.shared.contract.errors import InvalidInput


def _batch(t0: int, n: int, x: int = 0) -> np.ndarray:
    ev = np.zeros(n, dtype=EVENT_DTYPE)
    ev["t"] = np.arange(t0, t0 + n)
    ev["x"] = x
    return ev


def test_buffer_drops_oldest_and_counts() -> None:
    buf = LiveEventBuffer(10)
    buf.push(_batch(0, 6))
    buf.push(_batch(6, 6))  # wraps: 2 oldest dropped
    s = buf.stats()
    assert (s.received, s.dropped, s.buffered) == (12, 2, 10)
    assert buf.snapshot()["t"].tolist() == list(range(2, 12))
    assert buf.time_range_us() == (2, 12)
    assert buf.events_between(5, 9)["t"].tolist() == [5, 6, 7, 8]
    assert buf.events_between(0, 100)["t"].tolist() == list(range(2, 12))
    buf.push(_batch(12, 25))  # bigger than capacity: keeps the newest 10
    assert buf.snapshot()["t"].tolist() == list(range(27, 37))
    s = buf.stats()
    assert s.received == 37 and s.buffered == 10 and s.received == s.buffered + s.dropped


def test_buffer_discards_late_events_and_sorts_batches() -> None:
    buf = LiveEventBuffer(100)
    buf.push(_batch(10, 5))
    late = _batch(0, 3)
    buf.push(np.concatenate([late, _batch(20, 2)])[::-1])  # reversed: sorted on push
    assert buf.snapshot()["t"].tolist() == [10, 11, 12, 13, 14, 20, 21]
    s = buf.stats()
    assert s.late == 3 and s.dropped == 3 and s.received == s.buffered + s.dropped


def test_buffer_is_thread_safe() -> None:
    buf = LiveEventBuffer(1000)
    lock = threading.Lock()
    next_t = [0]

    def writer() -> None:
        for _ in range(200):
            with lock:  # producers hand over in time order, like one camera
                t0 = next_t[0]
                next_t[0] += 7
                buf.push(_batch(t0, 7))

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        snap = buf.snapshot()
        assert np.all(np.diff(snap["t"]) >= 0)
    for th in threads:
        th.join()
    s = buf.stats()
    assert s.received == 5600 and s.buffered == 1000 and s.dropped == 4600


def test_buffer_rejects_bad_capacity() -> None:
    with pytest.raises(InvalidInput):
        LiveEventBuffer(0)


def test_live_source_over_replay_reader() -> None:
    events = _batch(1_000, 5_000)
    events["x"] = np.arange(5_000) % 32
    with LiveSource(
        ReplayReader(events, batch_size=333), capacity=2_000, sensor_size=(32, 8)
    ) as src:
        assert src.wait_for(timeout_s=5.0)
        assert src.finished and src.error is None
        s = src.buffer.stats()
        assert (s.received, s.buffered, s.dropped) == (5_000, 2_000, 3_000)
        assert src.time_range_us() == (4_000, 6_000)
        assert np.array_equal(src.events_between(5_000, 5_010), events[4_000:4_010])
        assert src.rgb_frames_between(0, 10) == [] and not src.has_rgb
        assert "dropped 3000" in src.describe()


def test_live_source_drops_invalid_batches_and_reports_empty() -> None:
    bad = _batch(0, 10, x=99)  # off a 32-wide sensor
    with LiveSource(ReplayReader(bad, batch_size=10), capacity=100, sensor_size=(32, 8)) as src:
        assert src.wait_for(timeout_s=5.0)
        assert src.invalid == 10 and src.buffer.received == 0
        with pytest.raises(InvalidInput, match="no events"):
            src.time_range_us()


def test_live_source_surfaces_reader_errors() -> None:
    class Broken:
        def read(self) -> np.ndarray | None:
            raise OSError("camera unplugged")

        def close(self) -> None:
            pass

    src = LiveSource(Broken(), capacity=10, sensor_size=(4, 4))
    assert src.wait_for(timeout_s=5.0)
    assert isinstance(src.error, OSError)
    src.close()
