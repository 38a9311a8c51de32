"""Prophesee DAT files (``Event2d``, 8 bytes per event), memory-mapped.

Format (Prophesee "DAT File Format", Metavision SDK documentation; N-CARS and the
ATIS datasets use it): ``%`` header lines, then one byte event type and one byte event
size (DAT v2 and later), then little-endian records of two uint32:
t = w0 (µs), x = w1 & 0x3FFF, y = (w1 >> 14) & 0x3FFF, p = w1 >> 28.

The records are fixed size and time-ordered, so the file is memory-mapped and a window
is two binary searches: nothing is loaded beyond the window (bounded memory at any
size). A 5-line numpy decode, so no third-party decoder is needed (it matches
expelliarmus on both real files). Sensor size: ``% Width`` / ``% Height`` header
lines, else ``% geometry``, else the flag, else the events (max + 1; N-CARS files
are object crops with no size).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from eventspec.edge.events.base import (
    FixedSensor,
    SourceMeta,
    check_range,
    describe_recording,
    reading,
    recorded_sensor_size,
)
from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.shared.contract.errors import InvalidInput, NotFound

_RECORD = np.dtype([("t", "<u4"), ("w", "<u4")])
_TD_TYPES = (0, 12)  # Event2d, EventCD


class PropheseeDatSource(FixedSensor):
    """An EventSource over a DAT file's memory-mapped records."""

    def __init__(self, path: str | Path, *, sensor_size: tuple[int, int] | None = None) -> None:
        self._path = Path(path)
        if not self._path.is_file():
            raise NotFound(f"DAT file {self._path} does not exist")
        with reading(self._path, "DAT"):
            self._open(sensor_size)

    def _open(self, sensor_size: tuple[int, int] | None) -> None:
        """Header, record layout and index checks; every failure is named by the caller."""
        fields, offset = _read_header(self._path)
        version = int(fields.get("version", "1") or "1")
        ev_type, ev_size = 0, 8
        raw = self._path.read_bytes()[offset : offset + 2] if version >= 2 else b""
        if version >= 2:
            if len(raw) < 2:
                raise InvalidInput(
                    f"{self._path}: byte offset {offset}: file ends inside the event "
                    "type/size bytes"
                )
            ev_type, ev_size = raw[0], raw[1]
            offset += 2
        if ev_type not in _TD_TYPES or ev_size != 8:
            raise InvalidInput(
                f"{self._path}: byte offset {offset - 2}: event type {ev_type}, size "
                f"{ev_size}; expected a CD/Event2d stream (type 0 or 12, 8 bytes)"
            )
        data = self._path.stat().st_size - offset
        if data % 8:
            raise InvalidInput(
                f"{self._path}: byte offset {offset + data - data % 8}: truncated: "
                f"{data % 8} trailing byte(s), expected whole 8-byte records"
            )
        if data == 0:
            raise InvalidInput(f"{self._path}: holds no events after its header")
        self._rec = np.memmap(self._path, dtype=_RECORD, mode="r", offset=offset)  # [N]
        self._t = self._rec["t"]
        if bool(np.any(self._t[1:] < self._t[:-1])):
            i = int(np.argmax(self._t[1:] < self._t[:-1])) + 1
            raise InvalidInput(
                f"{self._path}: byte offset {offset + 8 * i}: timestamp {int(self._t[i])} "
                f"< previous {int(self._t[i - 1])}; expected time-ordered records"
            )
        w = self._rec["w"]
        max_x, max_y = int((w & 0x3FFF).max()), int(((w >> 14) & 0x3FFF).max())
        if int((w >> 28).max()) > 1:
            raise InvalidInput(f"{self._path}: polarity above 1; expected 0/1 (not a CD stream?)")
        size, size_from = recorded_sensor_size(
            self._path, _header_geometry(fields), sensor_size, (max_x, max_y))
        self._fix_sensor(size)
        self.meta = SourceMeta("DAT", size_from, "µs since the recording started")

    @property
    def num_events(self) -> int:
        return int(self._t.size)

    def describe(self) -> str:
        return describe_recording(f"dat:{self._path}", self.num_events, self._sensor_size,
                                  self.meta, self.time_range_us())

    def time_range_us(self) -> tuple[int, int]:
        return int(self._t[0]), int(self._t[-1]) + 1

    def events_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        check_range(t0_us, t1_us)
        lo, hi = np.searchsorted(self._t, [max(t0_us, 0), max(t1_us, 0)], side="left")
        rec = np.asarray(self._rec[int(lo) : int(hi)])  # copies only the window
        ev = np.empty(rec.size, dtype=EVENT_DTYPE)
        w = rec["w"]
        ev["t"] = rec["t"]
        ev["x"] = w & 0x3FFF
        ev["y"] = (w >> 14) & 0x3FFF
        ev["p"] = w >> 28
        return ev

    def rgb_frames_between(self, t0_us: int, t1_us: int) -> list[tuple[int, np.ndarray]]:
        check_range(t0_us, t1_us)
        return []


def _header_geometry(fields: dict[str, str]) -> tuple[tuple[int, int], str] | None:
    """Sensor size from ``% Width`` / ``% Height``, else ``% geometry``, or None."""
    if "width" in fields and "height" in fields:
        return (int(fields["width"]), int(fields["height"])), "header geometry"
    if m := re.fullmatch(r"(\d+)x(\d+)", fields.get("geometry", "")):
        return (int(m[1]), int(m[2])), "header geometry"
    return None


def _read_header(path: Path) -> tuple[dict[str, str], int]:
    """``% Key value`` lines at the top -> (lower-cased fields, byte offset after them)."""
    fields: dict[str, str] = {}
    offset = 0
    with path.open("rb") as fh:
        while fh.read(1) == b"%":
            fh.seek(offset)
            line = fh.readline(4096)
            if not line.endswith(b"\n"):
                raise InvalidInput(
                    f"{path}: byte offset {offset}: header line without an end"
                )
            offset += len(line)
            key, _, value = line[1:].decode("ascii", "replace").strip().partition(" ")
            fields[key.lower()] = value.strip()
            fh.seek(offset)
    return fields, offset
