"""AEDAT 4.0 files (iniVation DV): events, and frames when the camera recorded them.

Decoder: ``dv-processing`` (iniVation's own library, C++ with Python bindings, a CPU
wheel). It is the reference implementation of the format (LZ4/Zstd-compressed
FlatBuffers packets), and its ``MonoCameraRecording`` uses the file's data table (the
packet index DV writes when it closes a file) to seek: ``getEventsTimeRange`` reads
only the packets of a window, so memory stays bounded on long recordings. The
alternative ``aedat`` (Rust) decodes identical arrays but only sequentially, with no
seek. Files without a data table (trimmed clips, recordings cut off by a crash) are
read once sequentially into memory, with a warning.

Sensor size is the events stream's ``sizeX``/``sizeY`` from the file's stream header
(``header geometry``). Time is the camera's clock: absolute µs since the Unix epoch.
DAVIS frames come back as RGB (grey frames repeated over 3 channels) for the frames
path.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from eventspec.edge.events.base import FixedSensor, SourceMeta, check_range
from eventspec.edge.events.types import EVENT_DTYPE, empty_events
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput, NotFound

log = logging.getLogger(__name__)

AEDAT4_MAGIC = b"#!AER-DAT4.0\r\n"


def dv_module() -> Any:
    """``dv_processing``, or FailedPrecondition saying how to install it."""
    try:
        import dv_processing
    except ImportError as exc:
        raise FailedPrecondition(
            "reading AEDAT4 needs the dv-processing package (pip install "
            "'eventspec[edge]' or dv-processing==2.0.4)"
        ) from exc
    return dv_processing


def events_from_dv(batch: Any) -> np.ndarray:
    """dv.EventStore -> EVENT_DTYPE (fields timestamp, x, y, polarity)."""
    if batch is None:
        return empty_events()
    a = batch.numpy()  # [N] (timestamp i8, x i2, y i2, polarity i1)
    ev = np.empty(a.size, dtype=EVENT_DTYPE)
    ev["t"], ev["x"], ev["y"], ev["p"] = a["timestamp"], a["x"], a["y"], a["polarity"]
    return ev


def _to_rgb(image: np.ndarray) -> np.ndarray:
    """A DV frame (grey [H, W], or BGR [H, W, 3]) -> RGB [H, W, 3] uint8."""
    img = np.asarray(image)
    if img.ndim == 2:
        return np.repeat(img[:, :, None], 3, axis=2)
    if img.shape[2] == 1:
        return np.repeat(img, 3, axis=2)
    return np.ascontiguousarray(img[:, :, 2::-1])  # DV frames are OpenCV BGR


def locate_damage(path: Path) -> str:
    """Where an AEDAT4 file's framing breaks, for an error message.

    Layout (iniVation, "AEDAT 4.0 file format"): the 14-byte magic, an int32 header
    size, the header, then packets of int32 stream id + int32 size + payload. The walk
    stops at the first size that runs past the end of the file.
    """
    total = path.stat().st_size
    with path.open("rb") as fh:
        fh.seek(len(AEDAT4_MAGIC))
        raw = fh.read(4)
        if len(raw) < 4:
            return f"byte offset {len(AEDAT4_MAGIC)}: file ends before the header size"
        header = int.from_bytes(raw, "little", signed=True)
        offset = len(AEDAT4_MAGIC) + 4 + header
        if header < 0 or offset > total:
            return (f"byte offset {len(AEDAT4_MAGIC)}: header of {header} bytes runs past "
                    f"the end of the {total}-byte file (truncated?)")
        while offset + 8 <= total:
            fh.seek(offset)
            size = int.from_bytes(fh.read(8)[4:], "little", signed=True)
            if size < 0 or offset + 8 + size > total:
                return (f"byte offset {offset}: packet of {size} bytes runs past the end of "
                        f"the {total}-byte file (truncated?)")
            offset += 8 + size
    return f"byte offset {offset}: packet framing ends here; expected a packet header"


class Aedat4Source(FixedSensor):
    """An EventSource over an AEDAT4 recording (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        if not self._path.is_file():
            raise NotFound(f"AEDAT4 file {self._path} does not exist")
        with self._path.open("rb") as fh:
            magic = fh.read(len(AEDAT4_MAGIC))
        if magic != AEDAT4_MAGIC:
            raise InvalidInput(
                f"{self._path}: byte offset 0: expected the AEDAT4 magic {AEDAT4_MAGIC!r}, "
                f"got {magic!r}"
            )
        if self._path.suffix.lower() != ".aedat4":
            raise InvalidInput(
                f"{self._path}: an AEDAT4 file must end in .aedat4 for dv-processing to open it"
            )
        dv = dv_module()
        try:
            self._rec = dv.io.MonoCameraRecording(str(self._path))
        except RuntimeError as exc:
            lines = [ln for ln in str(exc).splitlines() if ln and not ln.startswith("/")]
            why = (lines[0] if lines else str(exc)).split(" - Error info")[0]
            raise InvalidInput(
                f"{self._path}: {locate_damage(self._path)}; dv-processing: {why}"
            ) from exc
        if not self._rec.isEventStreamAvailable():
            raise InvalidInput(f"{self._path}: has no events stream")
        res = self._rec.getEventResolution()
        self._camera = str(self._rec.getCameraName())
        self._lock = threading.Lock()
        self._fix_sensor((int(res[0]), int(res[1])),
                         has_rgb=bool(self._rec.isFrameStreamAvailable()))
        tr = self._rec.getTimeRange()
        self._indexed = int(tr[1]) > int(tr[0])
        self._events: np.ndarray | None = None
        self._frames: list[tuple[int, np.ndarray]] = []
        try:
            if self._indexed:
                self._t_first, self._t_last = self._probe_span(int(tr[0]), int(tr[1]))
            else:
                log.warning("%s has no packet index (data table); reading it whole", self._path)
                self._load_all()
        except RuntimeError as exc:
            raise InvalidInput(
                f"{self._path}: corrupt AEDAT4 data: {str(exc).splitlines()[0]}"
            ) from exc
        self.meta = SourceMeta(
            "AEDAT4", "header geometry", "µs since the Unix epoch (camera clock)"
        )

    def _load_all(self) -> None:
        parts = []
        while (batch := self._rec.getNextEventBatch()) is not None:
            parts.append(events_from_dv(batch))
        ev = np.concatenate(parts) if parts else empty_events()
        if ev.size == 0:
            raise InvalidInput(f"{self._path}: holds no events")
        if bool(np.any(np.diff(ev["t"]) < 0)):
            ev = ev[np.argsort(ev["t"], kind="stable")]
        self._events = ev
        if self.has_rgb:
            while (frame := self._rec.getNextFrame()) is not None:
                self._frames.append((int(frame.timestamp), _to_rgb(frame.image)))
        self._t_first, self._t_last = int(ev["t"][0]), int(ev["t"][-1])

    def _probe_span(self, t0: int, t1: int) -> tuple[int, int]:
        """First/last event times through the index: grow windows from each end."""
        first = events_from_dv(self._rec.getNextEventBatch())
        if first.size == 0:
            raise InvalidInput(f"{self._path}: holds no events")
        step = 1000
        while True:
            tail = events_from_dv(self._rec.getEventsTimeRange(max(t0, t1 - step), t1 + 1))
            if tail.size or t1 - step <= t0:
                break
            step *= 4
        last = int(tail["t"].max()) if tail.size else int(first["t"][-1])
        return int(first["t"][0]), last

    def describe(self) -> str:
        t0, t1 = self.time_range_us()
        w, h = self._sensor_size
        frames = ", with frames" if self.has_rgb else ""
        return (
            f"aedat4:{self._path} ({self._camera}, {w}x{h} [{self.meta.size_from}], "
            f"{(t1 - t0) / 1e6:.3f} s{frames}, t: {self.meta.time_base})"
        )

    def time_range_us(self) -> tuple[int, int]:
        return self._t_first, self._t_last + 1

    def events_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        check_range(t0_us, t1_us)
        if self._events is not None:
            ev = self._events
        else:
            with self._lock:
                ev = events_from_dv(self._rec.getEventsTimeRange(t0_us, t1_us))
            if bool(np.any(np.diff(ev["t"]) < 0)):
                ev = ev[np.argsort(ev["t"], kind="stable")]
        lo, hi = np.searchsorted(ev["t"], [t0_us, t1_us], side="left")
        return ev[int(lo) : int(hi)]

    def rgb_frames_between(self, t0_us: int, t1_us: int) -> list[tuple[int, np.ndarray]]:
        check_range(t0_us, t1_us)
        if not self.has_rgb:
            return []
        if not self._indexed:
            return [(t, img) for t, img in self._frames if t0_us <= t < t1_us]
        with self._lock:
            frames = self._rec.getFramesTimeRange(t0_us, t1_us) or []
        return [(int(f.timestamp), _to_rgb(f.image)) for f in frames
                if t0_us <= int(f.timestamp) < t1_us]
