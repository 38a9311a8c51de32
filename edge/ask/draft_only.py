"""draft_only: the edge answers alone (no cloud), greedily, labelled as unverified."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence

from eventspec.edge.drafting.cache import DraftBackend, DraftCache
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.vision.inputs import PreparedVisual
from eventspec.edge.worker import ModelWorker
from eventspec.shared.contract.stops import StopMatcher
from eventspec.shared.contract.types import (
    AskEvent,
    AskSpec,
    CommittedEvent,
    FinalEvent,
    FinishReason,
    GenerationSettings,
    Mode,
    RequestStats,
)


def decode_after(draft: DraftModel, ids: Sequence[int], prefix: Sequence[int] = ()) -> str:
    """Text that ``ids`` add after ``prefix`` (decoding together keeps spacing right)."""
    tok = draft.tokenizer
    whole = str(tok.decode(list(prefix) + list(ids), skip_special_tokens=True))
    head = str(tok.decode(list(prefix), skip_special_tokens=True)) if prefix else ""
    return whole[len(head) :] if whole.startswith(head) else whole


async def answer_draft_only(
    spec: AskSpec, settings: GenerationSettings, prepared: PreparedVisual, draft: DraftModel,
    worker: ModelWorker, backend: DraftBackend | None = None,
) -> AsyncIterator[AskEvent]:
    """The edge alone: greedy EventGPT output, labelled as unverified, under the same
    stop rules as the cloud's (EOS, stop strings, token cap, context). ``settings`` come
    from ``eventspec.edge.ask.checks.draft_only_settings``, which refuses what this cannot do."""
    started = time.perf_counter()
    drafter = DraftCache(backend if backend is not None else draft)
    await worker.run(lambda: drafter.prefill(spec.question, prepared.event_pixels))
    first_at: float | None = None
    text = ""
    answer: list[int] = []
    stops = StopMatcher(settings.stop)
    reason: FinishReason | None = None
    while reason is None:
        token = await worker.run(lambda seq=tuple(answer): drafter.draft_next(seq))  # type: ignore[misc]
        answer.append(token)
        first_at = first_at or time.perf_counter()
        text = decode_after(draft, answer)
        stop_at = stops.feed(text)
        if token == draft.eos_token_id:
            reason = FinishReason.EOS
        elif stop_at is not None:
            reason, text = FinishReason.STOP_STRING, text[:stop_at]
        elif len(answer) >= settings.max_new_tokens:
            reason = FinishReason.MAX_TOKENS
        yield CommittedEvent(len(answer) - 1, (token,), text)
    ids = tuple(answer)
    now = time.perf_counter()
    yield FinalEvent(
        answer=text,
        token_ids=ids,
        mode=Mode.DRAFT_ONLY,
        feature_mode=None,
        finish_reason=reason,
        stats=RequestStats(
            target_steps=0,
            new_tokens=len(ids),
            ttft_ms=((first_at or now) - started) * 1e3,
            total_ms=(now - started) * 1e3,
            stage_ms={"draft_prefill": drafter.prefill_ms, "edge_render": prepared.render_ms},
        ),
        plan=None,
        window=prepared.window,
    )
