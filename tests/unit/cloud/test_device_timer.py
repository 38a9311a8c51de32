"""The engine's own time per step, apart from the loop's (``cloud/scheduling/device_timer.py``):
on CPU the host's time around the call; the scheduler records it for every step."""

from __future__ import annotations

import torch

from eventspec.cloud.scheduling.device_timer import DeviceTimer
from eventspec.cloud.scheduling.scheduler import Scheduler
from tests.support.fake_engine import TEXT_VOCAB, FakeEngine
from tests.support.scheduler_sessions import answer, submit


def test_a_timer_reads_nothing_until_both_marks_and_then_the_span() -> None:
    timer = DeviceTimer(torch.device("cpu"))
    assert timer.elapsed_ms() is None
    timer.start()
    assert timer.elapsed_ms() is None  # no stop yet
    x = torch.randn(256, 256)
    for _ in range(20):
        x = x @ x.T / 256
    timer.stop()
    elapsed = timer.elapsed_ms()
    assert elapsed is not None and elapsed > 0


async def test_the_loop_records_the_engine_s_time_for_every_step() -> None:
    sched = Scheduler(FakeEngine(num_slots=2), text_vocab_size=TEXT_VOCAB)
    sched.start()
    try:
        await answer(submit(sched, "r0", (5, 6, 7), 8))
    finally:
        sched.stop()
    s = sched.stats
    assert s.steps > 0 and s.device_timed_steps == s.steps
    # On CPU the device time is the call's own host time: within the loop's step time.
    assert 0 < s.engine_device_ms <= s.engine_ms + s.sampler_ms + s.overhead_ms
