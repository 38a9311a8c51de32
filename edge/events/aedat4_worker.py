"""The child process that runs dv-processing on one AEDAT4 file (see ``aedat4_process``).

Why a separate process: dv-processing 2.0.4's ``MonoCameraRecording`` spins forever
(in C++, holding the GIL) on some damaged packets, in ``getEventsTimeRange`` and
already while opening a bit-flipped file. In the edge's own process that took a
thread, the GIL and with it every RPC and the SIGTERM handler. Here it can only take
this process, which the parent kills when a request passes its deadline.

This file is run as a script (``python -P aedat4_worker.py``), so it imports nothing
from eventspec: only the standard library, numpy and dv_processing. That keeps its
start-up at ~0.2 s instead of the ~2 s that importing the edge package costs.

Protocol, one request at a time: the parent writes one JSON line on stdin; the child
answers with one JSON line on stdout, followed by the ``.npy`` blobs (no pickle) whose
byte sizes the JSON line lists under ``"blobs"``.

- ``{"op": "open", "path": P}`` -> ``{"ok": true, "size": [w, h], "camera": ...,
  "has_frames": b, "time_range": [t0, t1]}``
- ``{"op": "next_events"}`` -> the next event batch in file order (blobs: 0 or 1)
- ``{"op": "events", "t0": a, "t1": b}`` -> ``getEventsTimeRange(a, b)`` (blobs: 0 or 1)
- ``{"op": "frames", "t0": a, "t1": b}`` -> frames with their timestamps (blobs: n)
- ``{"op": "next_frame"}`` -> the next frame in file order (blobs: 0 or 1)

Event blobs hold dv-processing's own structured array (timestamp, x, y, polarity);
frame blobs hold the image as dv-processing gives it (grey or BGR). A failure is
``{"ok": false, "error": "..."}``; the child then keeps serving.
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any, BinaryIO

import numpy as np


def _blob(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _reply(out: BinaryIO, head: dict[str, Any], arrays: list[np.ndarray]) -> None:
    blobs = [_blob(a) for a in arrays]
    head = {"ok": True, **head, "blobs": [len(b) for b in blobs]}
    out.write(json.dumps(head).encode() + b"\n")
    for b in blobs:
        out.write(b)
    out.flush()


def _first_line(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).splitlines() if ln and not ln.startswith("/")]
    return (lines[0] if lines else type(exc).__name__).split(" - Error info")[0]


def serve(inp: BinaryIO, out: BinaryIO) -> None:
    """Answer requests until stdin closes."""
    import dv_processing as dv

    rec: Any = None
    for line in inp:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "open":
                rec = dv.io.MonoCameraRecording(req["path"])
                has_events = bool(rec.isEventStreamAvailable())
                res = rec.getEventResolution() if has_events else (0, 0)
                tr = rec.getTimeRange()
                _reply(out, {"size": [int(res[0]), int(res[1])], "has_events": has_events,
                             "camera": str(rec.getCameraName()),
                             "has_frames": bool(rec.isFrameStreamAvailable()),
                             "time_range": [int(tr[0]), int(tr[1])]}, [])
            elif op in ("events", "next_events"):
                batch = (rec.getNextEventBatch() if op == "next_events"
                         else rec.getEventsTimeRange(int(req["t0"]), int(req["t1"])))
                _reply(out, {}, [] if batch is None else [batch.numpy()])
            elif op == "frames":
                frames = rec.getFramesTimeRange(int(req["t0"]), int(req["t1"])) or []
                _reply(out, {"timestamps": [int(f.timestamp) for f in frames]},
                       [np.asarray(f.image) for f in frames])
            elif op == "next_frame":
                frame = rec.getNextFrame()
                _reply(out, {"timestamps": [] if frame is None else [int(frame.timestamp)]},
                       [] if frame is None else [np.asarray(frame.image)])
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:  # any library failure goes back as text; keep serving
            out.write(json.dumps({"ok": False, "error": _first_line(exc)}).encode() + b"\n")
            out.flush()


def die_with_parent(parent_pid: int) -> None:
    """Linux: be killed when the parent dies, even by ``kill -9``, so a child spinning in
    the library is never orphaned at 100% of a core. Elsewhere: nothing (the parent's
    deadline and stdin's end still bound it)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import os
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        die_with_parent(int(sys.argv[1]))
    serve(sys.stdin.buffer, sys.stdout.buffer)
