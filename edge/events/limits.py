"""Caps on what a file source may decode into memory (issue 38, red-team finding 4).

Why: the readers of per-sample formats (``.npz``, ``.npy``, ECD text, N-MNIST ``.bin``)
hold the whole file in memory, and a compressed container says nothing of its decoded
size until it is decoded: a 1.7 MB ``.npz`` of zeros took the edge to 2.9 GB, a 0.5 MB
zipped ``events.txt`` to 3.2 GB. So each of those readers checks what the format
declares before reading it: a zip member's uncompressed size (``ZipInfo.file_size``,
which also bounds what ``zipfile`` will inflate), an ``.npy`` header's shape and dtype,
a plain file's size. Text declares no count, so it is counted while it is parsed.

The formats read by windows (RAW, DAT, AEDAT4, DSEC) keep a bounded index, not the
events, so these caps do not apply to them; nor to live or built-in sources.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.shared.contract.errors import InvalidInput

__all__ = [
    "DEFAULT_MAX_SOURCE_BYTES",
    "DEFAULT_MAX_SOURCE_EVENTS",
    "NpyHeader",
    "SourceLimits",
    "check_npy_file",
    "check_npz",
    "read_npy_header",
]

#: ``--max-source-events``: 10 M events are 130 MB in the edge's 13-byte event dtype;
#: the per-sample files these readers serve hold 10^4 to 10^6 (longer recordings belong
#: in the formats read by windows).
DEFAULT_MAX_SOURCE_EVENTS = 10_000_000
#: ``--max-source-bytes``: 512 MiB decoded (a zip member inflated, a file read whole, the
#: arrays an ``.npy``/``.npz`` header declares): 10 M events in four int64 columns fit.
DEFAULT_MAX_SOURCE_BYTES = 512 << 20

_NPY_MAGIC = b"\x93NUMPY"
_RAISE = ("raise the cap only for a file you trust, on an edge with the memory (about "
          f"{EVENT_DTYPE.itemsize} bytes an event)")
_ADVICE = f"refused before reading it into memory; {_RAISE}"


@dataclass(frozen=True)
class SourceLimits:
    """The most events and decoded bytes a file source may bring into memory.

    ``eventspec-edge serve --max-source-events`` / ``--max-source-bytes`` (and their
    ``EVENTSPEC_EDGE_*`` variables) set them; the defaults guard a reader used alone.
    """

    max_events: int = DEFAULT_MAX_SOURCE_EVENTS
    max_bytes: int = DEFAULT_MAX_SOURCE_BYTES

    def check_events(self, where: object, n: int, verb: str = "declares") -> None:
        """InvalidInput naming ``where`` when ``n`` events are over the cap."""
        if n > self.max_events:
            raise InvalidInput(f"{where}: {verb} {n:,} events, more than --max-source-events "
                               f"({self.max_events:,}); {_ADVICE}")

    def check_bytes(self, where: object, n: int, verb: str = "decodes to") -> None:
        """InvalidInput naming ``where`` when ``n`` decoded bytes are over the cap."""
        if n > self.max_bytes:
            raise InvalidInput(f"{where}: {verb} {n:,} bytes, more than --max-source-bytes "
                               f"({self.max_bytes:,}); {_ADVICE}")

    def events_counted(self, where: object, counted: int) -> None:
        """For text, counted while parsed: refuse as soon as the count passes the cap."""
        if counted > self.max_events:
            raise InvalidInput(f"{where}: holds more than {self.max_events:,} events "
                               f"(--max-source-events), counted while parsing; reading "
                               f"stopped there; {_RAISE}")


@dataclass(frozen=True)
class NpyHeader:
    """What an ``.npy`` header declares: elements, bytes of array data, where data starts."""

    count: int
    nbytes: int
    data_offset: int
    hasobject: bool


def read_npy_header(fh: IO[bytes], where: object) -> NpyHeader:
    """The header at ``fh``'s position (a file or a zip member), read without its data.

    The element count is a Python int product, so a shape numpy would refuse ("Maximum
    allowed dimension exceeded", "array is too big") comes back as a number to compare.
    """
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
    except Exception as exc:  # a damaged header dict fails in ast/tokenize too
        raise InvalidInput(
            f"{where}: not a readable .npy header: {type(exc).__name__}: {exc}") from exc
    count = math.prod(int(d) for d in shape)
    return NpyHeader(count, count * dtype.itemsize, fh.tell(), bool(dtype.hasobject))


def _require_data(where: object, header: NpyHeader, held: int) -> None:
    """A member or file holding less data than its header declares is cut short: refused
    here, because numpy allocates the declared size before it finds out."""
    if not header.hasobject and held < header.nbytes:
        raise InvalidInput(f"{where}: truncated: its header declares {header.nbytes:,} bytes "
                           f"of array data; it holds {held:,}")


def check_npy_file(path: Path, limits: SourceLimits) -> None:
    """A structured ``.npy``: its declared events and bytes under the caps, and present."""
    with path.open("rb") as fh:
        header = read_npy_header(fh, path)
    limits.check_events(path, header.count)
    limits.check_bytes(path, header.nbytes, "declares")
    _require_data(path, header, path.stat().st_size - header.data_offset)


def check_npz(path: Path, zf: zipfile.ZipFile, limits: SourceLimits) -> None:
    """Every member of an ``.npz`` under the caps, from the zip directory and the members'
    ``.npy`` headers (a few hundred bytes inflated each), before any array is read.

    A member that is no ``.npy`` (np.load hands those over as bytes) counts its
    uncompressed size.
    """
    infos = zf.infolist()
    limits.check_bytes(path, sum(i.file_size for i in infos))
    headers = [(info, _member_header(path, zf, info)) for info in infos]
    for info, header in headers:
        if header is not None:
            limits.check_events(f"{path}!{info.filename}", header.count)
    declared = sum(info.file_size if h is None else h.nbytes for info, h in headers)
    limits.check_bytes(path, declared, "its arrays declare")
    for info, header in headers:
        if header is not None:
            _require_data(f"{path}!{info.filename}", header,
                          info.file_size - header.data_offset)


def _member_header(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> NpyHeader | None:
    """The ``.npy`` header of one member, or None for a member that is not an array."""
    with zf.open(info) as fh:
        if fh.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
            return None
        fh.seek(0)
        return read_npy_header(fh, f"{path}!{info.filename}")
