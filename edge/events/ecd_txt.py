"""Event Camera Dataset ``events.txt`` (and a ``.zip`` holding one).

Format (Mueggler et al. 2017, "The event-camera dataset and simulator", IJRR): one
event per line, ``t x y p`` with t in seconds (float, since the recording's clock
start), p in {0, 1}. The text is parsed with numpy; t is converted to integer µs by
rounding (the files give 9 decimals). This reader holds the whole file's events: convert
big ones to npz first.

The text is streamed in blocks of ``BLOCK_BYTES`` (from the file, or inflated from the
zip) and counted as it goes, so neither the text nor a float table of all of it is ever
held, and a file over ``--max-source-events`` stops at the first block past the cap. Its
size (a zip member's declared ``file_size``) is checked against ``--max-source-bytes``
before any of it is read (issue 38, red-team finding 4).

Sensor size: the flag, else ``calib``-free inference from the events (max + 1); ECD's
DAVIS240C is 240x180, which the 5-event test excerpt does not reach.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from eventspec.edge.events.base import ArraySource, SourceMeta, existing_file, reading
from eventspec.edge.events.limits import SourceLimits
from eventspec.edge.events.types import EVENT_DTYPE, make_events
from eventspec.shared.contract.errors import InvalidInput

#: Bytes of text parsed at a time: its float table is about twice as large (ECD lines
#: are ~20 bytes, 4 floats of 8), and the count is checked after each block.
BLOCK_BYTES = 1 << 20
#: A line with any data on it (comment lines and blank ones carry none).
_DATA_LINE = re.compile(rb"^[ \t]*[^#\s]", re.M)


def read_ecd_stream(stream: IO[bytes], name: str, limits: SourceLimits) -> np.ndarray:
    """Parse a stream of ``t[s] x y p`` lines block by block, refusing once the events
    pass ``limits.max_events``."""
    parts: list[np.ndarray] = []
    counted = 0
    for first_line, block in _blocks(stream, name):
        ev = _parse_block(block, name, first_line)
        counted += ev.size
        limits.events_counted(name, counted)
        parts.append(ev)
    if counted == 0:
        raise InvalidInput(f"{name}: holds no events")
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _blocks(stream: IO[bytes], name: str) -> Iterator[tuple[int, bytes]]:
    """(number of the block's first line, whole lines of about BLOCK_BYTES) from
    ``stream``; the last line may lack its newline."""
    rest = b""
    line = 1
    while chunk := stream.read(BLOCK_BYTES):
        buf = rest + chunk
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            if len(buf) > 4 * BLOCK_BYTES:
                raise InvalidInput(f"{name}: line {line} runs past {len(buf):,} bytes "
                                   "without a newline; not 't x y p' text lines")
            rest = buf
            continue
        yield line, buf[:cut]
        line += buf.count(b"\n", 0, cut)
        rest = buf[cut:]
    if rest:
        yield line, rest


def _parse_block(block: bytes, name: str, first_line: int) -> np.ndarray:
    """One block's lines as events (none for a block of comments or blank lines)."""
    if not _DATA_LINE.search(block):
        return np.empty(0, dtype=EVENT_DTYPE)
    try:
        table = np.loadtxt(io.BytesIO(block), dtype=np.float64, ndmin=2, comments="#")
    except ValueError as exc:
        raise InvalidInput(
            f"{name}: not 't x y p' text lines (in the lines from line {first_line}): {exc}"
        ) from exc
    if table.shape[1] != 4:
        raise InvalidInput(
            f"{name}: line {first_line} has {table.shape[1]} columns; expected 4 (t[s] x y p)"
        )
    t = np.rint(table[:, 0] * 1e6)  # [N] µs
    return make_events(table[:, 1], table[:, 2], t, table[:, 3])


def check_text_size(path: Path, limits: SourceLimits) -> None:
    """The text's size (a zip member's declared ``file_size``) against the byte cap,
    without reading any of it: for the start-up check."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            pick = _events_member(path, zf)
            limits.check_bytes(f"{path}!{pick}", zf.getinfo(pick).file_size)
    else:
        limits.check_bytes(path, path.stat().st_size)


def _read_events(path: Path, limits: SourceLimits) -> tuple[np.ndarray, str]:
    """(events, name for messages) of a text file or a zip holding ``events.txt``, its
    size checked against the byte cap before a byte of text is read."""
    if zipfile.is_zipfile(path):
        return _read_zipped(path, limits)
    limits.check_bytes(path, path.stat().st_size)
    with path.open("rb") as stream:
        return read_ecd_stream(stream, str(path), limits), str(path)


def _read_zipped(path: Path, limits: SourceLimits) -> tuple[np.ndarray, str]:
    """The ``events.txt`` in a zip, refused from its declared size when over the cap
    (``zipfile`` never inflates a member past its ``file_size``)."""
    with zipfile.ZipFile(path) as zf:
        pick = _events_member(path, zf)
        name = f"{path}!{pick}"
        limits.check_bytes(name, zf.getinfo(pick).file_size)
        with zf.open(pick) as stream:
            return read_ecd_stream(stream, name, limits), name


def _events_member(path: Path, zf: zipfile.ZipFile) -> str:
    """The zip's ``events.txt`` (in any folder)."""
    names = [n for n in zf.namelist() if n.endswith(".txt")]
    pick = next((n for n in names if Path(n).name == "events.txt"), None)
    if pick is None:
        raise InvalidInput(f"{path}: zip holds no events.txt (has {zf.namelist()[:5]})")
    return pick


class EcdTextSource(ArraySource):
    """Events of an ECD ``events.txt`` or ``.zip``, held in memory."""

    def __init__(
        self,
        path: str | Path,
        *,
        sensor_size: tuple[int, int] | None = None,
        limits: SourceLimits | None = None,
    ) -> None:
        p = existing_file(path)
        with reading(p, "ECD text"):
            ev, name = _read_events(p, limits or SourceLimits())
        super().__init__(
            ev, sensor_size, name=f"txt:{name}",
            meta=SourceMeta(
                "ECD events.txt", "flag" if sensor_size else "inferred from events",
                "µs (the file's seconds x 1e6)",
            ),
        )
