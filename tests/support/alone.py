"""Decode one request alone, synchronously, through the scheduler's own pieces.

The same pure ``DecodingSession``, batched engine API and ``BatchedSampler`` the
scheduler uses, with a batch of one and no thread: the "alone" reference that batched
decoding is tested against, and a way to ask the target offline (toy-world checks).
Only tests use it, so it lives here rather than in the cloud package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from eventspec.cloud.engine.base import BatchedEngine, PrefillRequest
from eventspec.cloud.scheduling.sampler import BatchedSampler, SampleSpec, make_generator
from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.shared.contract.types import DraftTail
from eventspec.shared.node.static.batch import StepBatch

#: Given C so far, the edge's tail from ``len(C)`` (or None to send nothing).
Proposer = Callable[[Sequence[int]], DraftTail | None]


def decode_alone(
    engine: BatchedEngine,
    session: DecodingSession,
    prompt_ids: Sequence[int],
    *,
    pixel_values_videos: torch.Tensor | None = None,
    video_features: torch.Tensor | None = None,
    text_vocab_size: int,
    propose: Proposer | None = None,
) -> DecodingSession:
    """Prefill, then step until a stop rule fires; returns ``session`` (C is its answer).

    ``propose`` is asked before the prefill (hidden drafts) and before every step.
    The slot is freed at the end.
    """
    sampler = BatchedSampler(text_vocab_size)
    s = session.settings
    generator = make_generator(s.seed, engine.device) if s.temperature > 0 else None

    def offer() -> None:
        tail = propose(list(session.committed)) if propose is not None else None
        if tail is not None:
            session.offer_drafts(tail)

    try:
        offer()
        logits = engine.prefill([PrefillRequest(session.slot, list(prompt_ids),
                                                pixel_values_videos, video_features)])  # [1, V]
        session.mark_prefilled(0.0)
        drafts = session.drafts_now()
        v = sampler(logits, [SampleSpec(1, drafts, s.temperature, s.top_p, generator)])[0]
        session.commit(v.accepted, v.tokens, len(drafts), 0.0)
        while session.finish_reason is None:
            offer()
            inp = session.step_input()
            batch = StepBatch((inp.slot,), (inp.start_position,), (len(inp.tokens),),
                              torch.tensor(inp.tokens, device=engine.device))
            rows = engine.step(batch)  # [1 + drafts, V]
            spec = SampleSpec(len(inp.tokens), inp.drafts, s.temperature, s.top_p, generator)
            v = sampler(rows, [spec])[0]
            session.commit(v.accepted, v.tokens, len(inp.drafts), 0.0)
    finally:
        engine.free(session.slot)
    return session
