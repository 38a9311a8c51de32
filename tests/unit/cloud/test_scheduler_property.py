"""Property test: any interleaving of drafts, stale tails, cancels, deadlines and
disconnects through the real scheduler gives target-only answers and leaks no slot.

The engine is a fake with a deterministic "model": the next token is a hash of the
whole sequence so far, so a wrong start position, a lost rollback or a draft accepted
against the wrong row changes the answer. It keeps every slot's tokens, so the test can
also check that the scheduler freed every slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.tickets import Failure
from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.shared.contract.errors import ResourceExhausted
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.types import DraftTail, FinishReason, GenerationSettings
from eventspec.shared.node.static.buckets import TOKEN_BUCKETS, bucket
from tests.support.fake_engine import EOS, TEXT_VOCAB, FakeEngine, target_only
from tests.support.waiting import until


@dataclass(frozen=True)
class Req:
    prompt: tuple[int, ...]
    max_new: int
    speculative: bool
    k: int
    wrong_every: int  # every n-th draft is wrong (0 = never)
    stale_every: int  # every n-th tail is re-sent from an old base with a wrong overlap
    end: str  # "done", "cancel", "disconnect" or "deadline"
    end_after: int  # commits before the cancel / disconnect


requests = st.builds(
    Req,
    prompt=st.lists(st.integers(3, TEXT_VOCAB - 1), min_size=1, max_size=12).map(tuple),
    max_new=st.integers(1, 24),
    speculative=st.booleans(),
    k=st.integers(0, 8),
    wrong_every=st.integers(0, 4),
    stale_every=st.integers(0, 3),
    end=st.sampled_from(["done", "done", "cancel", "disconnect", "deadline"]),
    end_after=st.integers(0, 4),
)


#: ``--verify-width auto`` cost models: verifying a draft nearly free, dear, or dearer
#: than any draft can repay (then each session verifies one draft a step).
WIDTH_COSTS = {
    "all": None,
    "cheap": CloudCost(50.0, 0.1, 0.1, 5.0, 0.01, step_ms_per_session=0.5),
    "dear": CloudCost(50.0, 0.1, 0.1, 5.0, 2.0, step_ms_per_session=0.5),
    "prohibitive": CloudCost(50.0, 0.1, 0.1, 1.0, 50.0),
}


class PaddedFakeEngine(FakeEngine):
    """The fake engine with the static engine's padding hook (graph buckets), so the
    scheduler prices steps the padded way (``verify_widths(..., pad)``)."""

    def padded_tokens(self, q_max: int) -> int:
        return bucket(q_max, TOKEN_BUCKETS) or q_max


async def drive(reqs: Sequence[Req], num_slots: int, yields: Sequence[int],
                width: str = "all", padded: bool = False) -> None:
    engine = PaddedFakeEngine(num_slots) if padded else FakeEngine(num_slots)
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB, verify_cost=WIDTH_COSTS[width])
    sched.start()

    async def one(i: int, req: Req) -> None:
        for _ in range(yields[i % len(yields)]):
            await asyncio.sleep(0)
        truth = target_only(req.prompt, req.max_new, engine.max_seq_len)

        def make(slot: int) -> DecodingSession:
            return DecodingSession(
                settings=GenerationSettings(max_new_tokens=req.max_new), slot=slot,
                prompt_len=len(req.prompt), max_seq_len=engine.max_seq_len, eos_token_id=EOS,
                max_verify_tokens=9, decode=lambda ids: "", speculative=req.speculative,
                deadline_ms=1 if req.end == "deadline" else 0,
            )

        try:
            ticket = sched.admit(f"r{i}", make)
        except ResourceExhausted:
            return
        got: list[int] = []
        tails = 0

        def offer() -> None:
            nonlocal tails
            tails += 1
            base = len(got)
            drafts = [t if not req.wrong_every or (base + j) % req.wrong_every else
                      (t + 1) % TEXT_VOCAB for j, t in enumerate(truth[base : base + req.k])]
            if req.stale_every and tails % req.stale_every == 0 and base > 0:
                sched.offer(ticket, DraftTail(base - 1, ((got[-1] + 1) % TEXT_VOCAB, *drafts)))
            elif drafts:
                sched.offer(ticket, DraftTail(base, tuple(drafts)))

        offer()
        sched.submit_prefill(ticket, req.prompt, video_features=torch.zeros(1))
        commits = 0
        finish = None
        while finish is None:
            if req.end == "disconnect" and commits >= req.end_after:
                sched.release(ticket)  # the stream went away mid-answer
                return
            event = await ticket.events.get()
            assert not isinstance(event, Failure), event.error
            assert event.start == len(got)
            got.extend(event.tokens)
            commits += 1
            finish = event.finish_reason
            if req.end == "cancel" and commits >= req.end_after:
                sched.cancel(ticket)
            offer()
        sched.release(ticket)
        if finish in (FinishReason.CANCELLED, FinishReason.DEADLINE):
            assert got == truth[: len(got)], (req, got, truth)
        else:
            assert got == truth, (req, got, truth)
            assert all(t < TEXT_VOCAB for t in got)

    try:
        await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
        # Releases are commands: the engine thread takes them when it next runs.
        await until(lambda: sched.pool.free == num_slots, "every KV slot is back (none leaked)",
                    timeout_s=10)
    finally:
        await asyncio.to_thread(sched.stop)
    assert engine.slots == [None] * num_slots, "a slot was not freed in the engine"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(requests, min_size=1, max_size=8), num_slots=st.integers(1, 8),
       yields=st.lists(st.integers(0, 5), min_size=1, max_size=8),
       width=st.sampled_from(sorted(WIDTH_COSTS)), padded=st.booleans())
def test_every_interleaving_is_lossless_and_returns_every_slot(
    reqs: list[Req], num_slots: int, yields: list[int], width: str, padded: bool
) -> None:
    """With every valid draft verified, or with ``--verify-width auto`` trimming them
    under cost models from free to prohibitive, priced as rows fed or padded to the
    longest session (the static engine): the answers are target-only's."""
    asyncio.run(drive(reqs, num_slots, yields, width, padded))
