"""One log line for a condition that repeats, with a count, instead of one per poll.

Why: a node that polls a peer (the edge watching its cloud every 0.5 s) logged every
failed poll: 55 lines in 14 s while the cloud warmed up, 225 in 90 s for a cloud that
was down, each the same. An operator needs the first line, to know it still holds,
and when it ended: ``RepeatLog`` logs a condition when it starts, then at most once per
``interval_s`` with "(repeated N times in T s)", and that summary once more when the
condition changes or ends (:meth:`flush`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from typing import Any


class RepeatLog:
    """Rate-limited logging of one condition at a time for ``logger``."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._clock = clock
        self._key: Hashable | None = None
        self._line: tuple[int, str, tuple[Any, ...]] | None = None
        self._count = 0
        self._since = 0.0

    def report(self, level: int, key: Hashable, msg: str, *args: Any) -> None:
        """The condition ``key`` holds now: log it if it is new (closing the previous
        one's count) or if ``interval_s`` passed since its last line; else count it."""
        now = self._clock()
        if key != self._key:
            self.flush()
            self._key, self._line, self._count, self._since = key, (level, msg, args), 0, now
            self._logger.log(level, msg, *args)
            return
        self._line = (level, msg, args)
        self._count += 1
        if now - self._since >= self._interval_s:
            self._summary()

    def flush(self) -> None:
        """The condition ended: log its count if any line was held back; forget it."""
        if self._count:
            self._summary()
        self._key, self._line, self._count = None, None, 0

    def _summary(self) -> None:
        assert self._line is not None
        level, msg, args = self._line
        now = self._clock()
        self._logger.log(level, msg + " (repeated %d times in %.0f s)", *args, self._count,
                         now - self._since)
        self._count, self._since = 0, now
