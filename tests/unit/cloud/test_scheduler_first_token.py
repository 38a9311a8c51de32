"""A prefilled session's first token leaves the engine thread before the next batched
step, so a busy batch adds no step to its time to first token."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import torch

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.speculation.decoding import Committed, DecodingSession
from eventspec.shared.contract.types import GenerationSettings
from eventspec.shared.node.static.batch import StepBatch
from tests.support.fake_engine import EOS, TEXT_VOCAB, FakeEngine


class GatedStepEngine(FakeEngine):
    """Steps block once the second request has been prefilled, until ``open_gate``."""

    def __init__(self) -> None:
        super().__init__(num_slots=2)
        self.prefills = 0
        self.gate = threading.Event()

    def prefill(self, requests: Sequence[PrefillRequest]) -> torch.Tensor:
        self.prefills += len(requests)
        return super().prefill(requests)

    def step(self, batch: StepBatch) -> torch.Tensor:
        if self.prefills >= 2:
            assert self.gate.wait(timeout=10), "the test never opened the gate"
        return super().step(batch)


def _session(slot: int) -> DecodingSession:
    return DecodingSession(
        settings=GenerationSettings(max_new_tokens=40), slot=slot, prompt_len=3,
        max_seq_len=64, eos_token_id=EOS, max_verify_tokens=9, decode=lambda ids: "",
        speculative=False,
    )


async def test_first_token_is_delivered_while_the_next_step_is_still_running() -> None:
    engine = GatedStepEngine()
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB)
    sched.start()
    try:
        first = sched.admit("first", _session)
        sched.submit_prefill(first, (5, 6, 7), video_features=torch.zeros(1))
        assert isinstance(await asyncio.wait_for(first.events.get(), 5), Committed)
        second = sched.admit("second", _session)
        sched.submit_prefill(second, (8, 9, 10), video_features=torch.zeros(1))
        event = await asyncio.wait_for(second.events.get(), 5)  # the step is blocked now
        assert isinstance(event, Committed) and event.start == 0 and len(event.tokens) == 1
        assert not engine.gate.is_set()
        engine.gate.set()
        sched.cancel(first)
        sched.cancel(second)
    finally:
        engine.gate.set()
        await asyncio.to_thread(sched.stop)
    assert sched.stats.prefills == 2 and sched.stats.prefill_ms > 0.0
