"""A process-wide interpreter setting held by count, for the servers in one process.

The switch interval (:mod:`.switch_interval`) and the collector's freeze
(:mod:`.gc_freeze`) belong to the whole interpreter, and one process may run several
servers (tests, benchmarks): the first holder sets the setting up, every holder applies
it, and the last to let go puts it back, whatever order they stop in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class HeldSetting:
    """One such setting: ``hold`` and ``let_go`` in pairs, from any thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.holders = 0
        self._lock = threading.Lock()

    def hold(self, apply: Callable[[bool], None]) -> None:
        """Count one more holder and ``apply(first)`` (first: no one held it before)."""
        with self._lock:
            first = self.holders == 0
            self.holders += 1
            apply(first)

    def let_go(self, restore: Callable[[], None]) -> None:
        """Count one holder fewer; the last one calls ``restore``."""
        with self._lock:
            if self.holders == 0:
                raise RuntimeError(f"{self.name} was let go more often than held")
            self.holders -= 1
            if self.holders == 0:
                restore()
