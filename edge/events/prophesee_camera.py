"""Optional plugin: a Prophesee camera through the Metavision SDK / OpenEB bindings.

The bindings (``metavision_core``, ``metavision_hal``) ship with the Metavision SDK or
an OpenEB build, not on the package index (the index's ``metavision`` is unrelated).
When they are absent, opening the source fails with a message saying how to get
them; nothing else in the edge imports them. Untested here (no bindings, no camera):
it uses only ``metavision_core.event_io.EventsIterator``, the SDK's documented way to
read a live camera (``input_path`` = serial, or "" for the first camera), which yields
numpy arrays of ``EventCD`` (x, y, p, t) in µs on the camera clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from eventspec.edge.events.types import EVENT_DTYPE
from eventspec.shared.contract.errors import FailedPrecondition

#: Each yielded batch spans this much camera time.
BATCH_US = 1000


class PropheseeCameraReader:
    """An EventReader over a live Prophesee camera."""

    def __init__(self, serial: str = "") -> None:
        try:
            from metavision_core.event_io import EventsIterator
        except ImportError as exc:
            raise FailedPrecondition(
                "prophesee-camera needs the Metavision SDK or OpenEB Python bindings "
                "(metavision_core), which are not on the package index: install OpenEB "
                "and put its python directory on PYTHONPATH"
            ) from exc
        try:
            self._iterator: Any = EventsIterator(input_path=serial, delta_t=BATCH_US)
        except (OSError, RuntimeError) as exc:
            raise FailedPrecondition(
                f"could not open Prophesee camera {serial or '(first found)'}: {exc}"
            ) from exc
        height, width = self._iterator.get_size()
        self.resolution = (int(width), int(height))
        self._batches: Iterator[np.ndarray] = iter(self._iterator)
        self._closed = False

    def read(self) -> np.ndarray | None:
        if self._closed:
            return None
        cd = next(self._batches, None)  # [N] EventCD: x, y, p, t
        if cd is None:
            return None
        ev = np.empty(cd.size, dtype=EVENT_DTYPE)
        ev["x"], ev["y"], ev["t"], ev["p"] = cd["x"], cd["y"], cd["t"], cd["p"]
        return ev

    def close(self) -> None:
        self._closed = True
