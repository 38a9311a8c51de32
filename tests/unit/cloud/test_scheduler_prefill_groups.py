"""Prefills that wait together run in one engine call, within the token budget, oldest
first; a bad request in a group fails alone and the others are served."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest
import torch

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.tickets import Failure
from eventspec.shared.contract.errors import InvalidInput
from tests.support.fake_engine import TEXT_VOCAB, FakeEngine, target_only
from tests.support.scheduler_sessions import answer, submit
from tests.support.waiting import until

POISON = 31  # a prompt holding this token is refused by the engine


class RecordingEngine(FakeEngine):
    """Records each prefill call's slots; the first call sets ``entered`` and waits
    for ``gate``."""

    def __init__(self, num_slots: int) -> None:
        super().__init__(num_slots)
        self.calls: list[list[int]] = []
        self.entered = threading.Event()
        self.gate = threading.Event()

    def prefill(self, requests: Sequence[PrefillRequest]) -> torch.Tensor:
        if not self.calls:
            self.entered.set()
            assert self.gate.wait(timeout=10), "the test never opened the gate"
        self.calls.append([r.slot for r in requests])
        if any(POISON in r.input_ids for r in requests):
            raise InvalidInput("input_ids: a poisoned prompt")
        return super().prefill(requests)


async def test_waiting_prefills_share_a_call_within_the_budget_and_a_bad_one_fails_alone() -> None:
    engine = RecordingEngine(num_slots=5)
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB, prefill_token_budget=10)
    sched.start()
    prompts = [(5, 6, 7), (8, 9, 10, 11), (12, 13, POISON), (14, 15, 16), (17, 18, 19, 20)]
    try:
        tickets = []
        for i, prompt in enumerate(prompts):
            ticket = submit(sched, f"r{i}", prompt, 6)
            tickets.append(ticket)
            if i == 0:
                # The others must queue while the first call runs (and is blocked).
                await until(engine.entered.is_set, "the first prefill call is running")
        engine.gate.set()
        results = await asyncio.gather(*(answer(t) for t in tickets))
    finally:
        engine.gate.set()
        await asyncio.to_thread(sched.stop)
    slots = [t.slot for t in tickets]
    # r0 alone (it was the only one waiting); then r1, r2, r3 (4 + 3 + 3 = 10 tokens, the
    # budget; r4 would exceed it), which fails on the poisoned r2 and is retried one by
    # one; then r4.
    assert engine.calls[0] == [slots[0]]
    assert engine.calls[1] == [slots[1], slots[2], slots[3]]
    assert engine.calls[2:5] == [[slots[1]], [slots[2]], [slots[3]]]
    assert engine.calls[5] == [slots[4]]
    for i, result in enumerate(results):
        if i == 2:
            assert isinstance(result, Failure) and "poisoned" in str(result.error)
        else:
            assert result == target_only(prompts[i], 6, 64), i
    assert sched.stats.prefills == 4
    assert sched.pool.free == 5, "a finished or failed request kept its slot"


async def test_a_prompt_longer_than_the_budget_still_runs_alone() -> None:
    engine = RecordingEngine(num_slots=2)
    engine.gate.set()
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB, prefill_token_budget=2)
    sched.start()
    try:
        ticket = submit(sched, "long", (3, 4, 5, 6, 7), 3)
        result = await answer(ticket)
    finally:
        await asyncio.to_thread(sched.stop)
    assert result == target_only((3, 4, 5, 6, 7), 3, 64)
    assert engine.calls == [[ticket.slot]]


def test_the_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="prefill_token_budget"):
        Scheduler(FakeEngine(1), text_vocab_size=TEXT_VOCAB, prefill_token_budget=0)
