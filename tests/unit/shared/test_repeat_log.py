"""RepeatLog: a condition is logged when it starts, then once per interval with a count,
and its count once more when it changes or ends (issue 38, item 5). A fake clock: no
sleeping."""

from __future__ import annotations

import logging

import pytest

from eventspec.shared.node.repeat_log import RepeatLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_repeats_are_counted_and_summarised(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.repeat")
    clock = Clock()
    repeat = RepeatLog(log, interval_s=60, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.repeat"):
        for _ in range(55):  # the cloud warming up, polled every 0.25 s for 14 s
            repeat.report(logging.INFO, "warming", "cloud at %s is warming up", "c:1")
            clock.now += 0.25
        repeat.report(logging.WARNING, "down", "cloud at %s is unreachable: %s", "c:1", "refused")
        for _ in range(360):  # down for 90 s
            clock.now += 0.25
            repeat.report(logging.WARNING, "down", "cloud at %s is unreachable: %s", "c:1",
                          "refused")
        repeat.flush()  # ready again
        repeat.flush()  # nothing more to say
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "cloud at c:1 is warming up",
        "cloud at c:1 is warming up (repeated 54 times in 14 s)",
        "cloud at c:1 is unreachable: refused",
        "cloud at c:1 is unreachable: refused (repeated 240 times in 60 s)",
        "cloud at c:1 is unreachable: refused (repeated 120 times in 30 s)",
    ]
    assert [r.levelno for r in caplog.records][2:] == [logging.WARNING] * 3
