"""When the engine loop hands results to the event loop (``EngineLoop._iterate``).

On CUDA a step's results wait until the next step is queued, so the streams' work
overlaps the device instead of the next launch; with no step to follow they go out at
once. On CPU (the engine call is the computation) they go out after each step. Both
paths run here on the fake engine, the CUDA one by setting the loop's switch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import torch

from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.tickets import Outbox, SchedulerEvent, Ticket
from eventspec.shared.node.static.batch import StepBatch
from tests.support.fake_engine import TEXT_VOCAB, FakeEngine, target_only
from tests.support.scheduler_sessions import answer, submit

MAX_SEQ = 64


class CountingEngine(FakeEngine):
    """Counts its step calls, so a hand-over can say which steps had been queued."""

    def __init__(self, num_slots: int) -> None:
        super().__init__(num_slots, MAX_SEQ)
        self.steps = 0

    def step(self, batch: StepBatch) -> torch.Tensor:
        self.steps += 1
        return super().step(batch)


def _long_prompt() -> tuple[int, ...]:
    """A prompt whose answer runs 12 tokens without EOS."""
    return next(p for p in ((s, s + 1, s + 2) for s in range(3, 200))
                if len(target_only(p, 12, MAX_SEQ)) == 12)


async def _hand_overs(behind: bool, monkeypatch: pytest.MonkeyPatch
                      ) -> tuple[list[int] | object, list[tuple[int, int]]]:
    """One 12-token answer; returns it and, per hand-over, (the steps queued by then,
    the committed tokens it carried)."""
    engine = CountingEngine(num_slots=2)
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB)
    sched.engine_loop._hand_over_behind = behind
    seen: list[tuple[int, int]] = []
    flush = Outbox.flush

    def logged(self: Outbox, loop: asyncio.AbstractEventLoop | None) -> None:
        items: Sequence[tuple[Ticket, SchedulerEvent]] = self._items
        tokens = sum(len(getattr(e, "tokens", ())) for _, e in items)
        if tokens:
            seen.append((engine.steps, tokens))
        flush(self, loop)

    monkeypatch.setattr(Outbox, "flush", logged)
    sched.start()
    try:
        ticket = submit(sched, "r", _long_prompt(), 12, max_seq_len=MAX_SEQ)
        got = await answer(ticket)
    finally:
        await asyncio.to_thread(sched.stop)
    return got, seen


async def test_on_cuda_a_steps_results_wait_for_the_next_steps_launch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    got, seen = await _hand_overs(True, monkeypatch)
    assert got == target_only(_long_prompt(), 12, MAX_SEQ)
    first, *steps, last = seen
    assert first == (0, 1)  # the prefill's first token: at once, before any step
    # Step k's token goes out once step k + 1 is queued, one token each...
    assert steps == [(k + 1, 1) for k in range(1, 11)]
    # ...and the last step's when nothing follows it: nothing is held back.
    assert last == (11, 1)


async def test_on_cpu_each_steps_results_go_out_after_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    got, seen = await _hand_overs(False, monkeypatch)
    assert got == target_only(_long_prompt(), 12, MAX_SEQ)
    assert seen == [(k, 1) for k in range(12)]
