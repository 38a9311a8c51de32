"""The interpreter's thread switch interval while engine loops run, shared by all of them.

Why: the engine thread gives the GIL up at every torch call and waits up to the switch
interval (5 ms by default) to get it back from the gRPC event loop; a short interval
bounds that wait (``eventspec.cloud.scheduling.engine_loop``). The interval is process-wide, so with
several engine loops in one process (tests, benchmarks) the first to start saves the
interpreter's own and the last to stop puts it back, in whatever order they stop.
"""

from __future__ import annotations

import sys

from eventspec.cloud.process.process_wide import HeldSetting

_setting = HeldSetting("the switch interval")
_saved = 0.0


def hold(interval_s: float) -> None:
    """An engine loop starts: the interval is at most ``interval_s`` until it lets go."""

    def apply(first: bool) -> None:
        global _saved
        if first:
            _saved = sys.getswitchinterval()
        sys.setswitchinterval(min(interval_s, sys.getswitchinterval()))

    _setting.hold(apply)


def let_go() -> None:
    """An engine loop that held the interval stopped; the last one restores it."""
    _setting.let_go(lambda: sys.setswitchinterval(_saved))
