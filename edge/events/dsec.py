"""DSEC sequences: Blosc-compressed HDF5 events plus rectified RGB PNGs.

Layout (https://dsec.ifi.uzh.ch/data-format/)::

    <seq>/events/left/events.h5     /events/{x,y} u16, /events/p u8, /events/t u32 (µs,
                                    relative), /ms_to_idx, /t_offset (i64)
    <seq>/images/left/rectified/*.png
    <seq>/images/timestamps.txt     one absolute µs timestamp per image

A sequence holds hundreds of millions of events, so nothing is loaded up front: a
window is located through ``ms_to_idx`` (index of the first event at or after each
millisecond) and only that slice is read. Absolute time is ``t + t_offset``, the clock
the image timestamps use.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from eventspec.edge.events.base import FixedSensor, SourceMeta, check_range, reading
from eventspec.edge.events.types import EVENT_DTYPE, empty_events, validate_events
from eventspec.shared.contract.errors import InvalidInput, NotFound

log = logging.getLogger(__name__)

#: The DSEC event camera (Prophesee Gen3.1) resolution.
DSEC_SENSOR_SIZE = (640, 480)
_EVENTS_REL = Path("events/left/events.h5")
_IMAGES_REL = Path("images/left/rectified")
_TIMESTAMPS_REL = Path("images/timestamps.txt")


class DsecSource(FixedSensor):
    """An EventSource over one DSEC sequence directory (or its ``events.h5`` directly)."""

    def __init__(
        self, seq_dir: str | Path, *, sensor_size: tuple[int, int] = DSEC_SENSOR_SIZE
    ) -> None:
        import h5py
        import hdf5plugin  # noqa: F401  (registers the Blosc filter DSEC files need)

        root = Path(seq_dir)
        if root.is_file():
            events_path = root
            # <seq>/events/left/events.h5 -> <seq>
            seq_root: Path | None = root.parents[2] if len(root.parents) >= 3 else None
        else:
            if not root.exists():
                raise NotFound(f"DSEC sequence directory {root} does not exist")
            events_path = root / _EVENTS_REL
            seq_root = root
        if not events_path.is_file():
            raise NotFound(f"DSEC events file {events_path} not found")
        try:
            self._file: Any = h5py.File(events_path, "r")
        except OSError as exc:
            raise InvalidInput(f"{events_path} is not a readable HDF5 file: {exc}") from exc
        self._lock = threading.Lock()
        self._path = events_path
        self.meta = SourceMeta(
            "DSEC HDF5", "format (DSEC's Gen3.1 camera)", "µs, t + t_offset (the images' clock)"
        )
        try:
            with reading(events_path, "DSEC"):  # a damaged chunk fails inside h5py
                self._index()
            self._frames, self._frame_ts = _find_frames(seq_root)
        except BaseException:
            self._file.close()
            raise
        self._fix_sensor(sensor_size, has_rgb=len(self._frames) > 0)

    def _index(self) -> None:
        """The datasets, their first and last times, and ``ms_to_idx``."""
        events_path = self._path
        group = self._file.get("events")
        missing = ["x", "y", "t", "p"] if group is None else [
            k for k in ("x", "y", "t", "p") if k not in group]
        if missing:
            # List what the file holds before closing it: a closed file has no names.
            where = "/" if group is None else "/events"
            held = sorted(self._file if group is None else group)
            self._file.close()
            what = "no /events group" if group is None else f"no /events/{{{','.join(missing)}}}"
            raise InvalidInput(
                f"{events_path} is not a DSEC events file: it has {what} ({where} holds "
                f"{held or 'nothing'})"
            )
        self._x, self._y, self._t, self._p = (group[k] for k in ("x", "y", "t", "p"))
        self._n = int(self._t.shape[0])
        if self._n == 0:
            self._file.close()
            raise InvalidInput(f"{events_path} holds no events")
        self._t_offset = int(self._file["t_offset"][()]) if "t_offset" in self._file else 0
        self._ms_to_idx: np.ndarray | None = (
            np.asarray(self._file["ms_to_idx"][:], dtype=np.int64)
            if "ms_to_idx" in self._file
            else None
        )
        if self._ms_to_idx is None:
            log.warning("%s has no /ms_to_idx; windows use a slower bisection", events_path)
        self._t_first = int(self._t[0])
        self._t_last = int(self._t[self._n - 1])

    # -- EventSource ---------------------------------------------------------------------

    def describe(self) -> str:
        t0, t1 = self.time_range_us()
        w, h = self._sensor_size
        return (
            f"dsec:{self._path} ({self._n} events, {w}x{h}, {(t1 - t0) / 1e6:.1f} s, "
            f"{len(self._frames)} RGB frames)"
        )

    def time_range_us(self) -> tuple[int, int]:
        return self._t_offset + self._t_first, self._t_offset + self._t_last + 1

    def events_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        check_range(t0_us, t1_us)
        with self._lock, reading(self._path, "DSEC"):  # chunks decode here, window by window
            lo = self._first_index_at(t0_us - self._t_offset)
            hi = self._first_index_at(t1_us - self._t_offset)
            if hi <= lo:
                return empty_events()
            ev = np.empty(hi - lo, dtype=EVENT_DTYPE)
            ev["x"] = self._x[lo:hi]
            ev["y"] = self._y[lo:hi]
            ev["t"] = self._t[lo:hi].astype(np.int64) + self._t_offset
            ev["p"] = self._p[lo:hi]
        with reading(self._path, "DSEC"):  # values out of range name the file too
            return validate_events(ev, self._sensor_size)

    def rgb_timestamps_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        check_range(t0_us, t1_us)
        lo, hi = np.searchsorted(self._frame_ts, [t0_us, t1_us], side="left")
        return self._frame_ts[int(lo) : int(hi)]

    def rgb_frames_between(self, t0_us: int, t1_us: int) -> list[tuple[int, np.ndarray]]:
        check_range(t0_us, t1_us)
        lo, hi = np.searchsorted(self._frame_ts, [t0_us, t1_us], side="left")
        return [
            (int(self._frame_ts[i]), _decode_image(self._frames[i].read_bytes()))
            for i in range(int(lo), int(hi))
        ]

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the HDF5 file; the source is unusable afterwards."""
        with self._lock:
            self._file.close()

    def __enter__(self) -> DsecSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------

    def _first_index_at(self, t_rel: int) -> int:
        """Index of the first event with relative t >= ``t_rel`` (``n`` if none)."""
        if t_rel <= self._t_first:
            return 0
        if t_rel > self._t_last:
            return self._n
        if self._ms_to_idx is None:
            return _bisect_dataset(self._t, t_rel, 0, self._n)
        ms = t_rel // 1000
        table = self._ms_to_idx
        lo = int(table[min(ms, len(table) - 1)])
        hi = int(table[ms + 1]) if ms + 1 < len(table) else self._n
        lo, hi = max(0, min(lo, self._n)), max(0, min(hi, self._n))
        # ms_to_idx[ms] is the first event at/after ms*1000 µs; the target lies within
        # the events of millisecond ``ms``, so only that slice is read.
        chunk = np.asarray(self._t[lo:hi], dtype=np.int64)
        return lo + int(np.searchsorted(chunk, t_rel, side="left"))


def _bisect_dataset(dataset: Any, value: int, lo: int, hi: int) -> int:
    """First index in ``[lo, hi)`` of a sorted on-disk dataset with element >= value."""
    while lo < hi:
        mid = (lo + hi) // 2
        if int(dataset[mid]) < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _find_frames(seq_root: Path | None) -> tuple[list[Path], np.ndarray]:
    """Rectified left PNGs and their timestamps, or empty when the sequence has none."""
    none: tuple[list[Path], np.ndarray] = ([], np.zeros(0, dtype=np.int64))
    if seq_root is None:
        return none
    images_dir, ts_path = seq_root / _IMAGES_REL, seq_root / _TIMESTAMPS_REL
    if not images_dir.is_dir() or not ts_path.is_file():
        return none
    frames = sorted(images_dir.glob("*.png"))
    try:
        stamps = np.loadtxt(ts_path, dtype=np.int64, ndmin=1)
    except ValueError as exc:
        raise InvalidInput(f"{ts_path} is not one integer timestamp per line: {exc}") from exc
    if len(stamps) != len(frames):
        raise InvalidInput(
            f"{ts_path} lists {len(stamps)} timestamps but {images_dir} holds {len(frames)} PNGs"
        )
    if len(stamps) > 1 and bool(np.any(np.diff(stamps) < 0)):
        raise InvalidInput(f"{ts_path} timestamps are not ascending")
    return frames, stamps


def _decode_image(data: bytes) -> np.ndarray:
    """PNG bytes -> RGB, imported here: the image module brings torch (1.1 s), which
    ``eventspec-edge serve``'s source check before start-up must not wait for."""
    from eventspec.shared.node.imageproc import decode_image

    return decode_image(data)
