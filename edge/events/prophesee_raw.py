"""Prophesee RAW files (EVT 2.0 / EVT 3.0): header, block index, windowed decoding.

A RAW file is an ASCII header of ``% key value`` lines followed by the camera's word
stream (Metavision SDK documentation, "RAW File Format"). Recordings run to many GB,
so nothing is held whole: opening streams the file once in blocks of
``block_words`` words, decoding each (EVT 2.0 or 3.0 decoders here, written from the
spec) and keeping only a small index per block: its byte offset, the decoder state
at its start, its first/last event time and max x/y. A window then decodes just the
blocks that overlap it, from their saved states. Memory is one block plus the index
(about 100 bytes per block), whatever the file size.

Sensor size, in this order: the header's ``% geometry WxH`` line; the ``width=`` /
``height=`` fields of ``% format``; the ``% plugin_name`` (2020-era headers have no
geometry: gen3 -> 640x480, gen41 -> 1280x720, ...); the ``--sensor-size`` flag; the
events themselves (max + 1). ``meta.size_from`` says which was used. Time is the
camera's clock in µs since it started (or since the recording's first TIME_HIGH).
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eventspec.edge.events.base import (
    FixedSensor,
    SourceMeta,
    check_range,
    describe_recording,
    recorded_sensor_size,
)
from eventspec.edge.events.evt2 import Evt2State, decode_evt2
from eventspec.edge.events.evt3 import Evt3State, decode_evt3
from eventspec.edge.events.types import EVENT_DTYPE, empty_events
from eventspec.shared.contract.errors import InvalidInput, NotFound

log = logging.getLogger(__name__)

#: Prophesee HAL plugin name fragments -> sensor (width, height). Longest match wins.
PLUGIN_GEOMETRY: dict[str, tuple[int, int]] = {
    "gen3": (640, 480),
    "gen31": (640, 480),
    "gen4": (1280, 720),
    "gen41": (1280, 720),
    "imx636": (1280, 720),
    "imx646": (1280, 720),
    "imx8": (320, 320),
    "genx320": (320, 320),
    "saphir": (1280, 720),
}
DEFAULT_BLOCK_WORDS = 1 << 19
_MAX_HEADER_BYTES = 1 << 20


@dataclass(frozen=True)
class RawHeader:
    """The parsed ``%`` header: its fields, the encoding and where the data start."""

    fields: dict[str, str]
    encoding: str  # "evt2" | "evt3" | "" (not stated)
    data_offset: int


@dataclass(frozen=True)
class _Block:
    offset: int  # byte offset of the block's first word
    n_words: int
    state: Evt2State | Evt3State  # decoder state at the block's start
    t_first: int
    t_last: int
    n_events: int


def read_raw_header(path: Path) -> RawHeader:
    """Parse the ``%`` lines at the top of a RAW file (no data read)."""
    fields: dict[str, str] = {}
    offset = 0
    with path.open("rb") as fh:
        while True:
            if fh.read(1) != b"%":
                break
            fh.seek(offset)
            line = fh.readline(4096)
            if not line.endswith(b"\n") or offset > _MAX_HEADER_BYTES:
                raise InvalidInput(
                    f"{path}: byte offset {offset}: header line without an end (expected "
                    "'% key value' lines ending in a newline)"
                )
            offset += len(line)
            text = line[1:].decode("ascii", "replace").strip()
            if text == "end":
                break
            key, _, value = text.partition(" ")
            if key:
                fields[key.lower()] = value.strip()
    evt = fields.get("evt", "")
    fmt = fields.get("format", "").upper()
    encoding = (
        "evt3" if evt.startswith("3") or fmt.startswith("EVT3")
        else "evt2" if evt.startswith("2") or fmt.startswith("EVT2")
        else ""
    )
    return RawHeader(fields, encoding, offset)


def header_geometry(header: RawHeader) -> tuple[tuple[int, int], str] | None:
    """Sensor size from the header and which field gave it, or None."""
    geom = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", header.fields.get("geometry", ""))
    if geom:
        return (int(geom[1]), int(geom[2])), "header geometry"
    fmt = dict(
        kv.split("=", 1) for kv in header.fields.get("format", "").split(";") if "=" in kv
    )
    if "width" in fmt and "height" in fmt and fmt["width"].isdigit() and fmt["height"].isdigit():
        return (int(fmt["width"]), int(fmt["height"])), "header format field"
    plugin = header.fields.get("plugin_name", "").lower()
    hits = [k for k in PLUGIN_GEOMETRY if re.search(rf"(^|_){k}(_|$)", plugin)]
    if hits:
        return PLUGIN_GEOMETRY[max(hits, key=len)], "header plugin field"
    return None


class PropheseeRawSource(FixedSensor):
    """An EventSource over a Prophesee RAW file, decoded block by block (see module doc)."""

    def __init__(
        self,
        path: str | Path,
        *,
        encoding: str | None = None,
        sensor_size: tuple[int, int] | None = None,
        block_words: int = DEFAULT_BLOCK_WORDS,
    ) -> None:
        self._path = Path(path)
        if not self._path.is_file():
            raise NotFound(f"RAW file {self._path} does not exist")
        self._header = read_raw_header(self._path)
        enc = (encoding or self._header.encoding).lower()
        if encoding and self._header.encoding and encoding.lower() != self._header.encoding:
            raise InvalidInput(
                f"{self._path}: forced as {encoding}, but its header says "
                f"{self._header.encoding}"
            )
        if enc not in ("evt2", "evt3"):
            raise InvalidInput(
                f"{self._path}: byte offset 0: the header states no encoding (expected "
                "'% evt 2.0', '% evt 3.0' or '% format EVT2/EVT3'); force one with "
                "evt2:PATH or evt3:PATH"
            )
        self._enc = enc
        self._word = 4 if enc == "evt2" else 2
        self._block_words = int(block_words)
        self._lock = threading.Lock()
        data_bytes = self._path.stat().st_size - self._header.data_offset
        if data_bytes % self._word:
            raise InvalidInput(
                f"{self._path}: byte offset {self._path.stat().st_size - data_bytes % self._word}:"
                f" truncated: {data_bytes % self._word} trailing byte(s), expected whole "
                f"{self._word}-byte {enc.upper()} words"
            )
        self._blocks, max_x, max_y = self._build_index(data_bytes // self._word)
        n = sum(b.n_events for b in self._blocks)
        if n == 0:
            raise InvalidInput(f"{self._path}: holds no events after its header")
        size, size_from = recorded_sensor_size(
            self._path, header_geometry(self._header), sensor_size, (max_x, max_y),
            hint="; wrong encoding or geometry?")
        self._fix_sensor(size)
        self._n = n
        self.meta = SourceMeta(
            enc.upper(), size_from,
            "µs on the camera clock (since camera start)",
        )
        self._firsts = np.asarray([b.t_first for b in self._blocks], dtype=np.int64)
        self._lasts = np.asarray([b.t_last for b in self._blocks], dtype=np.int64)
        log.info("%s: %d events in %d blocks, %s", self._path, n, len(self._blocks),
                 self.describe())

    # -- index ---------------------------------------------------------------------------

    def _decode(
        self, words: np.ndarray, state: Evt2State | Evt3State, offset: int
    ) -> tuple[np.ndarray, Evt2State | Evt3State]:
        if self._enc == "evt2":
            assert isinstance(state, Evt2State)
            return decode_evt2(words, state, byte_offset=offset, path=str(self._path))
        assert isinstance(state, Evt3State)
        return decode_evt3(words, state, byte_offset=offset, path=str(self._path))

    def _read_words(self, offset: int, n_words: int) -> np.ndarray:
        dtype = "<u4" if self._word == 4 else "<u2"
        with self._path.open("rb") as fh:
            fh.seek(offset)
            return np.fromfile(fh, dtype=dtype, count=n_words)

    def _build_index(self, total_words: int) -> tuple[list[_Block], int, int]:
        """One streaming pass: decode each block, keep only its start state and stats."""
        blocks: list[_Block] = []
        state: Evt2State | Evt3State = Evt2State() if self._enc == "evt2" else Evt3State()
        max_x = max_y = -1
        last_t: int | None = None
        offset = self._header.data_offset
        for start in range(0, total_words, self._block_words):
            n_words = min(self._block_words, total_words - start)
            ev, end = self._decode(self._read_words(offset, n_words), state, offset)
            if ev.size:
                t = ev["t"]
                if (last_t is not None and int(t[0]) < last_t) or bool(np.any(t[1:] < t[:-1])):
                    raise InvalidInput(
                        f"{self._path}: block at byte offset {offset}: timestamps go "
                        "backwards; expected a time-ordered stream (corrupt or mislabelled?)"
                    )
                last_t = int(t[-1])
                max_x, max_y = max(max_x, int(ev["x"].max())), max(max_y, int(ev["y"].max()))
                blocks.append(_Block(offset, n_words, state, int(t[0]), int(t[-1]), ev.size))
            state = end
            offset += n_words * self._word
        return blocks, max_x, max_y

    # -- EventSource ---------------------------------------------------------------------

    @property
    def num_events(self) -> int:
        return self._n

    def describe(self) -> str:
        return describe_recording(f"{self._enc}:{self._path}", self._n, self._sensor_size,
                                  self.meta, self.time_range_us())

    def time_range_us(self) -> tuple[int, int]:
        return int(self._firsts[0]), int(self._lasts[-1]) + 1

    def events_between(self, t0_us: int, t1_us: int) -> np.ndarray:
        """Decode only the blocks whose [t_first, t_last] meets ``[t0_us, t1_us)``."""
        check_range(t0_us, t1_us)
        lo = int(np.searchsorted(self._lasts, t0_us, side="left"))
        hi = int(np.searchsorted(self._firsts, t1_us, side="left"))
        parts = []
        with self._lock:
            for b in self._blocks[lo:hi]:
                ev, _ = self._decode(self._read_words(b.offset, b.n_words), b.state, b.offset)
                a, z = np.searchsorted(ev["t"], [t0_us, t1_us], side="left")
                parts.append(ev[int(a) : int(z)])
        if not parts:
            return empty_events()
        out = np.concatenate(parts)
        return out if out.dtype == EVENT_DTYPE else out.astype(EVENT_DTYPE)

    def rgb_frames_between(self, t0_us: int, t1_us: int) -> list[tuple[int, np.ndarray]]:
        check_range(t0_us, t1_us)
        return []
