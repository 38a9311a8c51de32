"""Requests against a bare ``Scheduler`` (no gRPC) for the engine loop's tests: a session
factory for ``admit``, a request submitted with dummy features, and its whole answer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import torch

from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.tickets import Failure, Ticket
from eventspec.cloud.speculation.decoding import Committed, DecodingSession
from eventspec.shared.contract.types import GenerationSettings
from tests.support.fake_engine import EOS


def session_factory(max_new: int, prompt_len: int,
                    max_seq_len: int = 64) -> Callable[[int], DecodingSession]:
    """What ``Scheduler.admit`` calls with the slot it took: a greedy target-only session."""
    def make(slot: int) -> DecodingSession:
        return DecodingSession(
            settings=GenerationSettings(max_new_tokens=max_new), slot=slot,
            prompt_len=prompt_len, max_seq_len=max_seq_len, eos_token_id=EOS,
            max_verify_tokens=9, decode=lambda ids: "", speculative=False,
        )

    return make


def submit(sched: Scheduler, name: str, prompt: Sequence[int], max_new: int,
           features: torch.Tensor | None = None, max_seq_len: int = 64) -> Ticket:
    """Admit a request and queue its prefill (``features`` default: a dummy tensor)."""
    ticket = sched.admit(name, session_factory(max_new, len(prompt), max_seq_len))
    sched.submit_prefill(ticket, prompt,
                         video_features=torch.zeros(1) if features is None else features)
    return ticket


async def answer(ticket: Ticket, timeout_s: float = 20.0) -> list[int] | Failure:
    """Every token the request commits, or its failure."""
    got: list[int] = []
    while True:
        event = await asyncio.wait_for(ticket.events.get(), timeout_s)
        if isinstance(event, Failure):
            return event
        assert isinstance(event, Committed)
        got.extend(event.tokens)
        if event.finish_reason is not None:
            return got
