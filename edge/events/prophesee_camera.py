"""Optional plugin: a Prophesee camera through the Metavision SDK / OpenEB bindings.

The bindings (``metavision_hal``) ship with the Metavision SDK or an OpenEB build, not
on the package index (the index's ``metavision`` is unrelated). When they are absent,
opening the source fails with a message saying how to get them; nothing else in the
edge imports them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge.events.types import EVENT_DTYPE
from shared.errors import FailedPrecondition


class PropheseeCameraReader:
    """An EventReader over ``metavision_hal``'s device event stream."""

    def __init__(self, serial: str = "") -> None:
        try:
            import metavision_hal
        except ImportError as exc:
            raise FailedPrecondition(
                "prophesee-camera needs the Metavision SDK or OpenEB Python bindings "
                "(metavision_hal), which are not on the package index: install OpenEB "
                "and put its python path on PYTHONPATH"
            ) from exc
        self._device: Any = metavision_hal.DeviceDiscovery.open(serial)
        if self._device is None:
            raise FailedPrecondition(f"no Prophesee camera {serial or '(any)'} found")
        geometry = self._device.get_i_geometry()
        self.resolution = (int(geometry.get_width()), int(geometry.get_height()))
        self._stream = self._device.get_i_events_stream()
        self._decoder = self._device.get_i_events_stream_decoder()
        self._cd = self._device.get_i_event_cd_decoder()
        self._pending: list[np.ndarray] = []
        self._cd.add_event_buffer_callback(self._pending.append)
        self._stream.start()
        self._closed = False

    def read(self) -> np.ndarray | None:
        if self._closed:
            return None
        if self._stream.wait_next_buffer() < 0:
            return None
        self._decoder.decode(self._stream.get_latest_raw_data())
        batches, self._pending[:] = list(self._pending), []
        if not batches:
            return np.zeros(0, dtype=EVENT_DTYPE)
        cd = np.concatenate(batches)  # Metavision EventCD: x, y, p, t
        ev = np.empty(cd.size, dtype=EVENT_DTYPE)
        ev["x"], ev["y"], ev["t"], ev["p"] = cd["x"], cd["y"], cd["t"], cd["p"]
        return ev

    def close(self) -> None:
        self._closed = True
        self._stream.stop()
