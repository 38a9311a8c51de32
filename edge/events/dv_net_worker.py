"""The child process that reads a DV network stream with dv-processing (``dv-net:``).

Why a child: dv-processing decodes each packet (LZ4/Zstd, FlatBuffers) in C++ while
holding the GIL, and it spins forever on some damaged packets (``aedat4_worker``). A
damaged or hostile packet on the network must not stop the edge's RPCs and SIGTERM, so
the stream is decoded here. A second thread writes a heartbeat every
``HEARTBEAT_S``; while the library spins holding the GIL it cannot, and the parent
(``live_sources.DvNetReader``) ends this process when heartbeats stop.

Run as a script (``python -P dv_net_worker.py HOST PORT PARENT_PID``): imports nothing
from eventspec. Output, one JSON line per message, an event batch followed by its
``.npy`` blob (no pickle): ``{"connected": [w, h]}``, ``{"hb": 1}``,
``{"events": NBYTES}``, ``{"error": "..."}`` (then it exits).
"""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from typing import Any, BinaryIO

import numpy as np

HEARTBEAT_S = 0.5


class Out:
    """stdout shared by the reading loop and the heartbeat thread."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._lock = threading.Lock()

    def send(self, head: dict[str, Any], blob: bytes = b"") -> None:
        with self._lock:
            self._out.write(json.dumps(head).encode() + b"\n" + blob)
            self._out.flush()


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0].split(" [", 1)[0] if str(exc) else type(exc).__name__


def serve(host: str, port: int, out: Out) -> None:
    import dv_processing as dv

    try:
        reader = dv.io.NetworkReader(host, port)
        if not reader.isEventStreamAvailable():
            out.send({"error": f"dv-net {host}:{port} carries no events stream"})
            return
        res = reader.getEventResolution()
    except RuntimeError as exc:
        out.send({"error": _first_line(exc)})
        return
    out.send({"connected": [int(res[0]), int(res[1])]})

    def beat() -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            out.send({"hb": 1})

    threading.Thread(target=beat, daemon=True).start()
    while True:
        try:
            batch = reader.getNextEventBatch()
            running = bool(reader.isRunning())
        except RuntimeError as exc:
            out.send({"error": _first_line(exc)})
            return
        if batch is None:
            if not running:
                out.send({"error": "stream ended"})
                return
            time.sleep(0.002)
            continue
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(batch.numpy()), allow_pickle=False)
        blob = buf.getvalue()
        out.send({"events": len(blob)}, blob)


def die_with_parent(parent_pid: int) -> None:
    """Linux: killed with the parent (see ``aedat4_worker.die_with_parent``)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import os
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)


if __name__ == "__main__":
    die_with_parent(int(sys.argv[3]))
    serve(sys.argv[1], int(sys.argv[2]), Out(sys.stdout.buffer))
