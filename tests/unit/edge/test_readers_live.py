"""The dv-net live source against a real dv-processing NetworkWriter on loopback:
it fills the ring buffer on the camera's clock, reports health, reconnects with
backoff after the writer dies, and bounds how long a request waits for its clip."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eventspec.edge.events.live import LiveSource, ReplayReader
from eventspec.edge.events.live_sources import StreamHealth, open_live_source
from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.edge.events.windows import events_for_window, select_window
from eventspec.edge.servicer import source_status
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput, Unavailable

pytest.importorskip("dv_processing")
REAL = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "real"
RECORDING = REAL / "aedat4_dvxplorer_tonic_test_sample.aedat4"
T0 = 1605537493718345  # first event of the recording (its README)
ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(cond: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


class Writer:
    """One writer process of our own; stopped by its pid."""

    def __init__(self, port: int, start_us: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.dv_net_writer", str(RECORDING), str(port),
             str(start_us)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def port() -> Iterator[int]:
    yield free_port()


@pytest.mark.skipif(not RECORDING.is_file(), reason=f"{RECORDING} not found")
def test_dv_net_fills_reconnects_and_reports(port: int) -> None:
    first = Writer(port, T0)
    src = open_live_source("dv-net", f"127.0.0.1:{port}")
    second = None
    try:
        assert isinstance(src, LiveSource) and src.sensor_size == (320, 240)
        # A request for the latest 100 ms waits (bounded) until 100 ms are held.
        window = select_window(src, latest_ms=100, event_window_ms=20)
        assert window.clip_ms == 100.0 and window.t0_us >= T0  # the camera's clock
        assert events_for_window(src, window).size >= 100
        status = source_status(src)
        assert status["live"].connected and status["live"].received > 0
        health = src.health()
        assert isinstance(health, StreamHealth) and health.connected and health.reconnects == 0

        first.kill()
        assert wait_until(lambda: not src.health().connected), src.describe()  # type: ignore[union-attr]
        assert src.health().last_error  # type: ignore[union-attr]
        newest_before = src.time_range_us()[1]

        second = Writer(port, T0 + 400_000)  # the stream resumes later in camera time
        assert wait_until(lambda: src.time_range_us()[1] > T0 + 400_000), src.describe()
        health = src.health()
        assert isinstance(health, StreamHealth) and health.connected and health.reconnects == 1
        assert src.time_range_us()[1] > newest_before
        assert not src.finished and src.error is None
    finally:
        src.close()
        first.kill()
        if second is not None:
            second.kill()


def test_dv_net_without_a_server_is_a_clear_error(port: int) -> None:
    with pytest.raises(FailedPrecondition, match="no stream within"):
        open_live_source("dv-net", f"127.0.0.1:{port}", connect_timeout_s=0.3)
    with pytest.raises(InvalidInput, match="HOST:PORT"):
        open_live_source("dv-net", "nohostport")


def test_a_request_before_the_clip_is_recorded_waits_then_fails() -> None:
    ev = __import__("numpy").zeros(300, dtype=EVENT_DTYPE)
    ev["t"] = range(0, 30_000, 100)  # 30 ms of data, then the stream ends
    src = LiveSource(ReplayReader(ev, batch_size=50), 10_000, (4, 4), max_wait_s=0.3)
    try:
        src.wait_for(300)
        started = time.monotonic()
        with pytest.raises(Unavailable, match=r"holds 29\.9 ms.*latest 1000\.0 ms"):
            select_window(src, latest_ms=1000)
        assert time.monotonic() - started < 2.0
        assert select_window(src, latest_ms=20, event_window_ms=10).clip_ms == 20.0
    finally:
        src.close()


def test_prophesee_camera_plugin_absent_is_a_clear_error() -> None:
    with pytest.raises(FailedPrecondition, match="Metavision SDK or OpenEB"):
        open_live_source("prophesee-camera", "")
