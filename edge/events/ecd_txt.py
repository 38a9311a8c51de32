"""Event Camera Dataset ``events.txt`` (and a ``.zip`` holding one).

Format (Mueggler et al. 2017, "The event-camera dataset and simulator", IJRR): one
event per line, ``t x y p`` with t in seconds (float, since the recording's clock
start), p in {0, 1}. The text is parsed with numpy; t is converted to integer µs by
rounding (the files give 9 decimals). Large ECD sequences are parsed in one pass, so
this reader holds the whole file: convert big ones to npz first.

Sensor size: the flag, else ``calib``-free inference from the events (max + 1); ECD's
DAVIS240C is 240x180, which the 5-event test excerpt does not reach.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from eventspec.edge.events.base import ArraySource, SourceMeta
from eventspec.edge.events.types import make_events
from eventspec.shared.contract.errors import InvalidInput, NotFound


def read_ecd_text(data: bytes, name: str) -> np.ndarray:
    """Parse ``t[s] x y p`` lines into EVENT_DTYPE events."""
    try:
        table = np.loadtxt(io.BytesIO(data), dtype=np.float64, ndmin=2, comments="#")
    except ValueError as exc:
        raise InvalidInput(f"{name}: not 't x y p' text lines: {exc}") from exc
    if table.size == 0:
        raise InvalidInput(f"{name}: holds no events")
    if table.shape[1] != 4:
        raise InvalidInput(
            f"{name}: line 1 has {table.shape[1]} columns; expected 4 (t[s] x y p)"
        )
    t = np.rint(table[:, 0] * 1e6)  # [N] µs
    return make_events(table[:, 1], table[:, 2], t, table[:, 3])


def _read_bytes(path: Path) -> tuple[bytes, str]:
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith(".txt")]
            pick = next((n for n in names if Path(n).name == "events.txt"), None)
            if pick is None:
                raise InvalidInput(f"{path}: zip holds no events.txt (has {zf.namelist()[:5]})")
            return zf.read(pick), f"{path}!{pick}"
    return path.read_bytes(), str(path)


class EcdTextSource(ArraySource):
    """Events of an ECD ``events.txt`` or ``.zip``, held in memory."""

    def __init__(self, path: str | Path, *, sensor_size: tuple[int, int] | None = None) -> None:
        p = Path(path)
        if not p.is_file():
            raise NotFound(f"event file {p} does not exist")
        data, name = _read_bytes(p)
        ev = read_ecd_text(data, name)
        super().__init__(
            ev, sensor_size, name=f"txt:{name}",
            meta=SourceMeta(
                "ECD events.txt", "flag" if sensor_size else "inferred from events",
                "µs (the file's seconds x 1e6)",
            ),
        )
