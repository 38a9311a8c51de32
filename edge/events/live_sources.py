"""Live cameras and streams feeding the edge's ring buffer (``eventspec.edge.events.live``).

* ``dv-net:HOST:PORT``: an iniVation DV network stream, what DV's "Network output"
  module and ``dv-processing``'s ``NetworkWriter`` send (AEDAT4 packets over TCP).
  Read with ``dv_processing.io.NetworkReader``; when the stream drops or the server is
  not up yet, the reader reconnects with exponential backoff and the source keeps
  serving what it buffered. Its health (connected, reconnects, last error, age of the
  newest packet) shows in GetStatus.
* ``dv-camera[:SERIAL]``: an attached iniVation camera through
  ``dv_processing.io.camera.open``. Thin: same ring buffer and windows as the network
  source. Not testable without a camera.
* ``prophesee-camera[:SERIAL]``: a Prophesee camera through the Metavision SDK /
  OpenEB Python bindings (``metavision_core``), which are not on the package index:
  an optional plugin that fails with a clear message when they are absent.

Windows on live sources use the camera's clock: the latest N ms are the N ms before
the newest event received.
"""

from __future__ import annotations

import io
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eventspec.edge.events.aedat4 import dv_module, events_from_dv
from eventspec.edge.events.live import LiveSource
from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput
from eventspec.shared.node.repeat_log import RepeatLog

log = logging.getLogger(__name__)

#: Events kept by a live source: about 10 s of a busy VGA sensor.
DEFAULT_CAPACITY = 20_000_000


@dataclass(frozen=True)
class StreamHealth:
    """What GetStatus reports about a live stream."""

    connected: bool
    reconnects: int
    last_error: str
    seconds_since_data: float  # -1 before the first packet


def _first_line(exc: BaseException) -> str:
    """dv-processing errors carry a source location and a stack trace; keep the gist."""
    return str(exc).splitlines()[0].split(" [", 1)[0]


#: ``dv-net``: how long the decoder child may go without a heartbeat (it sends one every
#: 0.5 s) before it is taken as spinning on a damaged packet and ended.
STALL_S = 5.0
#: How long connecting (the child's start and the stream's header) may take.
CONNECT_S = 5.0
_NET_WORKER = Path(__file__).with_name("dv_net_worker.py")


class DvNetReader:
    """An EventReader over a DV network stream, reconnecting with backoff.

    ``read`` never raises for a dropped or absent server: it returns an empty batch
    while it waits to reconnect, so the LiveSource thread keeps running.

    The stream is decoded by dv-processing in a child process (``dv_net_worker``): a
    damaged packet that makes the library spin stops the child's heartbeats, and after
    ``stall_s`` without one the child is ended and the stream reconnected, instead of
    the library holding this process's GIL for good.
    """

    def __init__(
        self, host: str, port: int, *, backoff_s: float = 0.1, max_backoff_s: float = 5.0,
        stall_s: float = STALL_S, worker: Path = _NET_WORKER,
    ) -> None:
        self.host, self.port = host, port
        self._backoff0, self._max_backoff = backoff_s, max_backoff_s
        self._backoff = backoff_s
        self._stall_s = stall_s
        self._worker = worker
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._last_beat = 0.0
        self._closed = threading.Event()
        self._next_try = 0.0
        self.reconnects = -1  # the first connection is not a reconnect
        self.last_error = ""
        self._last_data = -1.0
        self._connected = False
        self.resolution: tuple[int, int] | None = None
        #: A stream that stays down is one line when it fails, then one a minute with a
        #: count, not one per retry (12 a minute at the 5 s backoff).
        self._down_log = RepeatLog(log)

    def _connect(self) -> bool:
        if time.monotonic() < self._next_try:
            return False
        dv_module()  # FailedPrecondition with the install hint, before starting a child
        self._proc = subprocess.Popen(
            [sys.executable, "-P", str(self._worker), self.host, str(self.port),
             str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True)
        self._buf = b""
        head = self._next_message(time.monotonic() + CONNECT_S)
        if head is None or "connected" not in head:
            why = (head or {}).get("error") or "no answer from the stream within " \
                f"{CONNECT_S:g} s"
            self._fail(str(why))
            return False
        w, h = head["connected"]
        self.resolution = (int(w), int(h))
        self._last_beat = time.monotonic()
        self._connected = True
        self.reconnects += 1
        self._backoff = self._backoff0
        self._down_log.flush()
        log.info("dv-net %s:%d connected (%dx%d)", self.host, self.port, *self.resolution)
        return True

    def _next_message(self, deadline: float) -> dict[str, Any] | None:
        """The child's next message (events decoded into ``"batch"``), or None when it
        has none by ``deadline`` or has gone."""
        proc = self._proc
        if proc is None or proc.stdout is None:
            return None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return {"error": "the stream's decoder exited"}
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        head: dict[str, Any] = json.loads(line)
        if "events" in head:
            size = int(head["events"])
            while len(self._buf) < size:
                if not select.select([fd], [], [], CONNECT_S)[0]:
                    return {"error": "the stream's decoder stopped mid-batch"}
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return {"error": "the stream's decoder exited"}
                self._buf += chunk
            blob, self._buf = self._buf[:size], self._buf[size:]
            head["batch"] = np.load(io.BytesIO(blob), allow_pickle=False)
        return head

    def _fail(self, why: str) -> None:
        self.last_error = why  # before "not connected": a reader of health sees both
        self._connected = False
        self._end_child()
        self._next_try = time.monotonic() + self._backoff
        self._down_log.report(logging.WARNING, why, "dv-net %s:%d: %s; retrying (backoff "
                              "up to %.0f s)", self.host, self.port, why, self._max_backoff)
        self._backoff = min(self._backoff * 2, self._max_backoff)

    def _end_child(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()

    def read(self) -> np.ndarray | None:
        if self._closed.is_set():
            return None
        if self._proc is None and not self._connect():
            return np.zeros(0, dtype=EVENT_DTYPE)
        parts = []
        deadline = time.monotonic() + 0.05
        while (head := self._next_message(deadline)) is not None:
            if "error" in head:
                self._fail(str(head["error"]))
                break
            self._last_beat = time.monotonic()
            if "batch" in head:
                parts.append(events_from_dv(head["batch"]))
        if self._proc is not None and time.monotonic() - self._last_beat > self._stall_s:
            self._fail(f"the stream's decoder stalled for {self._stall_s:g} s (a damaged "
                       "packet?); reconnecting")
        if not parts:
            return np.zeros(0, dtype=EVENT_DTYPE)
        self._last_data = time.monotonic()
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def health(self) -> StreamHealth:
        age = time.monotonic() - self._last_data if self._last_data >= 0 else -1.0
        return StreamHealth(self._connected, max(self.reconnects, 0), self.last_error, age)

    def close(self) -> None:
        self._closed.set()
        self._end_child()


class DvCameraReader:
    """An EventReader over an attached iniVation camera (``dv_processing``)."""

    def __init__(self, serial: str = "") -> None:
        dv = dv_module()
        try:
            self._cam = dv.io.camera.open(serial) if serial else dv.io.camera.open()
        except RuntimeError as exc:
            raise FailedPrecondition(
                f"could not open iniVation camera {serial or '(any)'}: "
                f"{str(exc).splitlines()[0]}"
            ) from exc
        res = self._cam.getEventResolution()
        self.resolution = (int(res[0]), int(res[1]))
        self._closed = False

    def read(self) -> np.ndarray | None:
        if self._closed or not self._cam.isRunning():
            return None
        return events_from_dv(self._cam.getNextEventBatch())

    def close(self) -> None:
        self._closed = True


def open_live_source(
    kind: str, arg: str, *, sensor_size: tuple[int, int] | None = None,
    capacity: int = DEFAULT_CAPACITY, connect_timeout_s: float = 5.0,
) -> LiveSource:
    """``dv-net`` / ``dv-camera`` / ``prophesee-camera`` -> a started LiveSource."""
    if kind == "dv-net":
        host, sep, port = arg.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidInput(f"dv-net needs HOST:PORT, got {arg!r}")
        net = DvNetReader(host.strip("[]"), int(port))
        deadline = time.monotonic() + connect_timeout_s
        while net.resolution is None and time.monotonic() < deadline:
            if not net._connect():
                time.sleep(0.05)
        size = sensor_size or net.resolution
        if size is None:
            raise FailedPrecondition(
                f"dv-net {arg}: no stream within {connect_timeout_s:.0f} s ({net.last_error}); "
                "pass --sensor-size to start anyway and keep retrying"
            )
        return LiveSource(net, capacity, size, name=f"dv-net:{arg}")
    if kind == "dv-camera":
        cam = DvCameraReader(arg)
        return LiveSource(cam, capacity, sensor_size or cam.resolution, name=f"dv-camera:{arg}")
    if kind == "prophesee-camera":
        from eventspec.edge.events.prophesee_camera import PropheseeCameraReader

        pc = PropheseeCameraReader(arg)
        return LiveSource(pc, capacity, sensor_size or pc.resolution,
                          name=f"prophesee-camera:{arg}")
    raise InvalidInput(f"unknown live source kind {kind!r}")
