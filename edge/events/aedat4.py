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
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from eventspec.edge.events.base import FixedSensor, SourceMeta, check_range
from eventspec.edge.events.decode_process import DecodeFailed, DecoderProcess, DecodeTimeout
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
    """dv.EventStore, or its ``.numpy()`` array as the decoder process sends it ->
    EVENT_DTYPE (fields timestamp, x, y, polarity)."""
    if batch is None:
        return empty_events()
    a = batch if isinstance(batch, np.ndarray) else batch.numpy()  # timestamp, x, y, polarity
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


#: How long one window's events (or frames) may take to decode before the decoder is
#: ended and the window refused. Healthy windows take milliseconds; this stays under
#: the edge's default drain time (``--grace-s`` 5 s), so SIGTERM is never held longer.
WINDOW_DEADLINE_S = 4.0
#: How long starting the decoder and opening the file (header and packet table) may take.
OPEN_DEADLINE_S = 8.0
_WORKER = Path(__file__).with_name("aedat4_worker.py")


class Aedat4Source(FixedSensor):
    """An EventSource over an AEDAT4 recording (see the module docstring).

    dv-processing runs in a child process (``decode_process``): on some damaged packets
    it spins forever holding the GIL, so in-process it took the whole edge down. Every
    request to the child has a deadline; one that misses it ends the child, refuses that
    window with INVALID_ARGUMENT naming the file and the time range, and remembers the
    range so a later request covering it is refused at once instead of spinning again.
    Other windows keep working on a fresh child.
    """

    def __init__(self, path: str | Path, *, window_deadline_s: float = WINDOW_DEADLINE_S,
                 open_deadline_s: float = OPEN_DEADLINE_S,
                 cancel: threading.Event | None = None) -> None:
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
        dv_module()  # FailedPrecondition with the install hint, before starting a child
        self._window_deadline_s = window_deadline_s
        self._bad_spans: list[tuple[int, int]] = []
        self._link_dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc = DecoderProcess(
            _WORKER, {"op": "open", "path": str(self._openable_path())}, open_deadline_s,
            cancel=cancel)
        try:
            self._open(open_deadline_s)
        except BaseException:
            self.close()
            raise

    def _openable_path(self) -> Path:
        """The path dv-processing is given: it opens only names ending in ``.aedat4``, and
        detection goes by content, so a renamed file is opened through a link."""
        if self._path.suffix.lower() == ".aedat4":
            return self._path
        self._link_dir = tempfile.TemporaryDirectory(prefix="eventspec-aedat4-")
        link = Path(self._link_dir.name) / "recording.aedat4"
        link.symlink_to(self._path.resolve())
        return link

    def _open(self, open_deadline_s: float) -> None:
        try:
            info = self._proc.start()
        except DecodeFailed as exc:
            raise InvalidInput(
                f"{self._path}: {locate_damage(self._path)}; dv-processing: {exc}"
            ) from exc
        except DecodeTimeout as exc:
            raise InvalidInput(
                f"{self._path}: dv-processing did not finish opening the file within "
                f"{open_deadline_s:g} s and was ended; the header or packet table is "
                "damaged (docs/input-formats.md, \"Damaged AEDAT4 files\")"
            ) from exc
        if not info.get("has_events"):
            raise InvalidInput(f"{self._path}: has no events stream")
        w, h = info["size"]
        self._camera = str(info["camera"])
        self._fix_sensor((int(w), int(h)), has_rgb=bool(info["has_frames"]))
        tr = info["time_range"]
        self._indexed = int(tr[1]) > int(tr[0])
        self._events: np.ndarray | None = None
        self._frames: list[tuple[int, np.ndarray]] = []
        self._t_first, self._t_last = int(tr[0]), int(tr[1])
        if self._indexed:
            self._t_first, self._t_last = self._probe_span(int(tr[0]), int(tr[1]))
        else:
            log.warning("%s has no packet index (data table); reading it whole", self._path)
            self._load_all()
            self._proc.close()  # everything is in memory now
        self.meta = SourceMeta(
            "AEDAT4", "header geometry", "µs since the Unix epoch (camera clock)"
        )

    def close(self) -> None:
        """End the decoder process and remove the temporary link (idempotent)."""
        self._proc.close()
        if self._link_dir is not None:
            self._link_dir.cleanup()
            self._link_dir = None

    def _call(self, req: dict[str, Any], what: str) -> tuple[dict[str, Any], list[np.ndarray]]:
        """One request to the decoder, its failures as InvalidInput naming the file."""
        try:
            return self._proc.request(req, self._window_deadline_s)
        except DecodeTimeout as exc:
            if req["op"] == "events":  # refuse this range at once from now on
                self._bad_spans.append((int(req["t0"]), int(req["t1"])))
            raise InvalidInput(
                f"{self._path}: {what} did not decode within {self._window_deadline_s:g} s: "
                "a damaged packet makes dv-processing spin, so it was ended and this range "
                "is refused; other windows still work (docs/input-formats.md, \"Damaged "
                "AEDAT4 files\")"
            ) from exc
        except DecodeFailed as exc:
            raise InvalidInput(f"{self._path}: {what}: corrupt AEDAT4 data: {exc}") from exc

    def _next_events(self) -> np.ndarray:
        _, arrays = self._call({"op": "next_events"}, "the next event packet")
        return events_from_dv(arrays[0] if arrays else None)

    def _load_all(self) -> None:
        parts = []
        while (batch := self._next_events()).size:
            parts.append(batch)
        ev = np.concatenate(parts) if parts else empty_events()
        if ev.size == 0:
            raise InvalidInput(f"{self._path}: holds no events")
        if bool(np.any(np.diff(ev["t"]) < 0)):
            ev = ev[np.argsort(ev["t"], kind="stable")]
        self._events = ev
        if self.has_rgb:
            while True:
                head, arrays = self._call({"op": "next_frame"}, "the next frame")
                if not arrays:
                    break
                self._frames.append((int(head["timestamps"][0]), _to_rgb(arrays[0])))
        self._t_first, self._t_last = int(ev["t"][0]), int(ev["t"][-1])

    def _probe_span(self, t0: int, t1: int) -> tuple[int, int]:
        """First/last event times through the index: grow windows from each end."""
        first = self._next_events()
        if first.size == 0:
            raise InvalidInput(f"{self._path}: holds no events")
        step = 1000
        while True:
            tail = self._events_range(max(t0, t1 - step), t1 + 1)
            if tail.size or t1 - step <= t0:
                break
            step *= 4
        last = int(tail["t"].max()) if tail.size else int(first["t"][-1])
        return int(first["t"][0]), last

    def _span_text(self, t0_us: int, t1_us: int) -> str:
        start = getattr(self, "_t_first", t0_us)
        return (f"[{t0_us}, {t1_us}) µs ({(t0_us - start) / 1e3:.1f} to "
                f"{(t1_us - start) / 1e3:.1f} ms into the recording)")

    def _events_range(self, t0_us: int, t1_us: int) -> np.ndarray:
        for a, b in self._bad_spans:
            if t0_us <= a and b <= t1_us:
                raise InvalidInput(
                    f"{self._path}: the events in {self._span_text(t0_us, t1_us)} cover "
                    f"{self._span_text(a, b)}, which did not decode earlier: a damaged "
                    "packet; refused without decoding again"
                )
        _, arrays = self._call({"op": "events", "t0": t0_us, "t1": t1_us},
                               f"the events in {self._span_text(t0_us, t1_us)}")
        return events_from_dv(arrays[0] if arrays else None)

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
            ev = self._events_range(t0_us, t1_us)
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
        head, arrays = self._call({"op": "frames", "t0": t0_us, "t1": t1_us},
                                  f"the frames in {self._span_text(t0_us, t1_us)}")
        return [(int(t), _to_rgb(img)) for t, img in zip(head["timestamps"], arrays, strict=True)
                if t0_us <= int(t) < t1_us]
