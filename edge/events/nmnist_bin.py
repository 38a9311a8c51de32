"""N-MNIST / N-Caltech101 ``.bin`` files: 40-bit ATIS records.

Format (Orchard et al. 2015, "Converting static image datasets to spiking neuromorphic
datasets using saccades", dataset README): 5 bytes per event, x (bits 39..32),
y (31..24), polarity (bit 23, 1 = ON), t (22..0, µs since the saccade started). A
record with y = 240 is a timestamp overflow marker: every later t gains 2^13 µs (the
rule tonic's ``read_mnist_file`` applies). The files are small (one digit or object
each), so they are decoded whole with numpy; no third-party decoder is needed.

Sensor size: N-MNIST is 34x34 by definition; other files (N-Caltech101 crops) are
sized by the flag, else by the events (max + 1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eventspec.edge.events.base import ArraySource, SourceMeta, existing_file, reading
from eventspec.edge.events.limits import SourceLimits
from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.shared.contract.errors import InvalidInput

NMNIST_SIZE = (34, 34)
_OVERFLOW_Y = 240


def check_bin_size(path: Path, limits: SourceLimits) -> None:
    """The file's size, and the records it makes (5 bytes each), against the caps."""
    size = path.stat().st_size
    limits.check_bytes(path, size)
    limits.check_events(path, size // 5)


def read_nmnist_bin(path: Path, limits: SourceLimits | None = None) -> np.ndarray:
    """Decode a ``.bin`` into EVENT_DTYPE events (stream order); the file's size, which
    says how many records it holds, is checked against ``limits`` before reading."""
    check_bin_size(path, limits or SourceLimits())
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size % 5:
        raise InvalidInput(
            f"{path}: byte offset {raw.size - raw.size % 5}: truncated: {raw.size % 5} "
            "trailing byte(s), expected whole 5-byte N-MNIST records"
        )
    rec = raw.reshape(-1, 5).astype(np.int64)  # [N, 5]
    y = rec[:, 1]
    t = ((rec[:, 2] & 0x7F) << 16) | (rec[:, 3] << 8) | rec[:, 4]  # [N]
    overflow = y == _OVERFLOW_Y
    t = t + np.cumsum(overflow) * (1 << 13)
    keep = ~overflow
    ev = np.empty(int(keep.sum()), dtype=EVENT_DTYPE)
    ev["x"], ev["y"], ev["t"] = rec[keep, 0], y[keep], t[keep]
    ev["p"] = rec[keep, 2] >> 7
    return ev


class NmnistBinSource(ArraySource):
    """Events of one N-MNIST / N-Caltech101 sample, held in memory."""

    def __init__(
        self,
        path: str | Path,
        *,
        sensor_size: tuple[int, int] | None = None,
        limits: SourceLimits | None = None,
    ) -> None:
        p = existing_file(path)
        with reading(p, "N-MNIST .bin"):
            ev = read_nmnist_bin(p, limits)
        if ev.size == 0:
            raise InvalidInput(f"{p}: holds no events")
        size_from = "flag" if sensor_size is not None else "inferred from events"
        fits_nmnist = int(ev["x"].max()) < 34 and int(ev["y"].max()) < 34
        if sensor_size is None and fits_nmnist:
            sensor_size, size_from = NMNIST_SIZE, "format (N-MNIST 34x34)"
        super().__init__(
            ev, sensor_size, name=f"bin:{p}",
            meta=SourceMeta("N-MNIST bin", size_from, "µs since the sample started"),
        )
