"""Per-request speculative decoding state on the cloud: the committed sequence C.

Pure logic over an engine (no gRPC, no asyncio). The cloud owns C. Each step verifies
whatever valid drafts extend C in one target forward (zero drafts is a plain decode
step), so speculation can only add tokens per step, never wait (DESIGN, "Speculation
invariants"). Drafts are self-validating: a ``DraftTail`` carries the committed length
the edge has seen (``base``) and its whole tail from there; the overlap with C is
checked and a disagreeing tail is dropped as stale.

Threading: ``run_prefill`` and ``run_step`` do model work and are called from the single
model worker; ``offer_drafts``, ``drafts_for_step`` and ``apply`` run on the event loop.
A session has at most one step in flight, so they never race on C.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cloud.engine.base import TargetEngine
from cloud.verify import VerifyResult, make_generator, mask_non_text, verify_greedy, verify_sampling
from shared.errors import InvalidInput
from shared.types import CommitEvent, DraftTail, FinishReason, GenerationSettings, RequestStats


def first_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index in ``text`` of the earliest stop string, or None when none occurs."""
    hits = [text.find(s) for s in stop if s in text]
    return min(hits) if hits else None


def stopped_text(text: str, stop: Sequence[str]) -> str:
    """``text`` cut before its earliest stop string (the answer a user sees)."""
    at = first_stop(text, stop)
    return text if at is None else text[:at]


@dataclass
class StepResult:
    """What one target step produced, before stop conditions are applied."""

    tokens: list[int]
    verified: int
    accepted: int
    ms: float


@dataclass
class _Counters:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    stale: int = 0
    rejections: int = 0
    hidden_drafted: int = 0
    stage_ms: dict[str, float] = field(default_factory=dict)

    def add_stage(self, name: str, ms: float) -> None:
        self.stage_ms[name] = self.stage_ms.get(name, 0.0) + ms


class DecodingSession:
    """The committed sequence, the latest draft tail and the KV state of one request."""

    def __init__(
        self,
        *,
        settings: GenerationSettings,
        text_vocab_size: int,
        eos_token_id: int,
        max_draft_tokens: int,
        max_verify_tokens: int,
        decode: Callable[[Sequence[int]], str],
        speculative: bool,
        deadline_ms: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.settings = settings
        self.text_vocab_size = text_vocab_size
        self.eos_token_id = eos_token_id
        self.max_draft_tokens = max_draft_tokens
        self.max_verify_tokens = max_verify_tokens
        self.speculative = speculative
        self.deadline_ms = deadline_ms
        self._decode = decode
        self._clock = clock
        self.started = clock()
        self.committed: list[int] = []
        self.tail: DraftTail | None = None
        self.finish_reason: FinishReason | None = None
        self.text = ""
        self.first_token_at: float | None = None
        self.prompt_len = 0
        self.engine_state: Any = None
        self._prefill_logits: torch.Tensor | None = None  # [V]
        self._hidden: list[int] = []
        self._generator = make_generator(settings.seed)
        self.counters = _Counters()

    # -- drafts (event loop) -----------------------------------------------------------

    def offer_drafts(self, tail: DraftTail) -> bool:
        """Validate a tail; keep it if its overlap with C agrees. Returns whether kept.

        A malformed tail (ids outside the text vocabulary, a base beyond C, too long) is
        an InvalidInput: the edge is broken, not merely late.
        """
        if tail.base < 0 or tail.base > len(self.committed):
            raise InvalidInput(
                f"Drafts.base {tail.base} is outside the committed answer (length "
                f"{len(self.committed)})"
            )
        if len(tail.token_ids) > self.max_draft_tokens:
            raise InvalidInput(
                f"Drafts tail of {len(tail.token_ids)} tokens exceeds the cap of "
                f"{self.max_draft_tokens}"
            )
        for tok in tail.token_ids:
            if not 0 <= tok < self.text_vocab_size:
                raise InvalidInput(
                    f"draft token id {tok} is outside the shared text vocabulary "
                    f"[0, {self.text_vocab_size})"
                )
        if not self.speculative or self.finish_reason is not None:
            return False
        overlap = self.committed[tail.base :]
        if list(tail.token_ids[: len(overlap)]) != overlap[: len(tail.token_ids)]:
            self.counters.stale += 1
            return False
        if len(tail.token_ids) <= len(overlap):
            return False
        self.tail = tail
        return True

    def drafts_for_step(self) -> list[int]:
        """The valid drafts extending C now (possibly none)."""
        if self.tail is None:
            return []
        overlap = len(self.committed) - self.tail.base
        if overlap < 0:
            return []
        if list(self.tail.token_ids[:overlap]) != self.committed[self.tail.base :]:
            self.tail = None
            return []
        drafts = list(self.tail.token_ids[overlap:])
        if not self.committed:
            return drafts[:1]
        return drafts[: max(0, self.max_verify_tokens - 1)]

    def mark_prefill_done(self) -> None:
        """Record the hidden drafts: those that arrived while the prefill ran."""
        tail = self.tail
        self._hidden = list(tail.token_ids) if tail is not None and tail.base == 0 else []
        self.counters.hidden_drafted = len(self._hidden)

    # -- model work (worker thread) -----------------------------------------------------

    def run_prefill(
        self,
        engine: TargetEngine,
        prompt_ids: Sequence[int],
        *,
        pixel_values_videos: torch.Tensor | None = None,
        video_features: torch.Tensor | None = None,
    ) -> float:
        """Prefill the prompt and keep the first-token logits. Returns ms."""
        t0 = self._clock()
        state, logits = engine.prefill(
            prompt_ids, pixel_values_videos=pixel_values_videos, video_features=video_features
        )
        self.engine_state = state
        self.prompt_len = len(prompt_ids)
        self._prefill_logits = logits
        ms = (self._clock() - t0) * 1e3
        self.counters.add_stage("prefill", ms)
        return ms

    def run_step(self, engine: TargetEngine, drafts: Sequence[int]) -> StepResult:
        """One target step over ``drafts`` (may be empty). Leaves the cache at P+|C'|-1.

        The first step reuses the prefill's logits: one row checks the first hidden
        draft for free. Later steps feed ``[C[-1]] + drafts`` and get k+1 rows.
        """
        t0 = self._clock()
        if not self.committed:
            if self._prefill_logits is None:
                raise RuntimeError("step before prefill")
            rows = self._prefill_logits.unsqueeze(0)  # [1, V]
            drafts = list(drafts[:1])
        else:
            rows = engine.step(self.engine_state, [self.committed[-1], *drafts])  # [k+1, V]
        rows = mask_non_text(rows, self.text_vocab_size)
        result = self._verify(rows, drafts)
        keep = self.prompt_len + len(self.committed) + len(result.tokens) - 1
        if self.committed and engine.seq_len(self.engine_state) != keep:
            engine.rollback(self.engine_state, keep)
        ms = (self._clock() - t0) * 1e3
        self.counters.add_stage("verify" if drafts else "decode", ms)
        return StepResult(result.tokens, len(drafts), result.accepted, ms)

    def _verify(self, rows: torch.Tensor, drafts: Sequence[int]) -> VerifyResult:
        s = self.settings
        if s.temperature == 0:
            return verify_greedy(rows, drafts)
        return verify_sampling(rows, drafts, s.temperature, s.top_p, self._generator)

    # -- applying results (event loop) ---------------------------------------------------

    def apply(self, step: StepResult) -> CommitEvent | None:
        """Append a step's tokens to C one at a time under the stop rules; return the Commit.

        A bulk commit must end at exactly the token where target-only decoding (one token
        per step) would stop, so every stop rule (EOS, stop string, token cap) is checked
        after each token, never once after the whole step.
        """
        start = len(self.committed)
        new: list[int] = []
        for tok in step.tokens:
            if self.finish_reason is not None:
                break
            new.append(tok)
            self.committed.append(tok)
            self.finish_reason = self._stop_after_token(tok)
        self.counters.drafted += step.verified
        self.counters.accepted += min(step.accepted, len(new))
        self.counters.steps += 1
        if step.accepted < step.verified:
            self.counters.rejections += 1
        if self.first_token_at is None and new:
            self.first_token_at = self._clock()
        self.text = stopped_text(self._decode(self.committed), self.settings.stop)
        if self.finish_reason is None and self.deadline_passed():
            self.finish_reason = FinishReason.DEADLINE
        if not new:
            return None
        return CommitEvent(
            start=start,
            token_ids=tuple(new),
            drafts_verified=step.verified,
            drafts_accepted=min(step.accepted, len(new)),
            text=self.text,
            at_ms=self.elapsed_ms(),
        )

    def _stop_after_token(self, tok: int) -> FinishReason | None:
        """The stop rule that fires once ``tok`` is the newest committed token, if any."""
        if tok == self.eos_token_id:
            return FinishReason.EOS
        stop = self.settings.stop
        if stop and first_stop(self._decode(self.committed), stop) is not None:
            return FinishReason.STOP_STRING
        if len(self.committed) >= self.settings.max_new_tokens:
            return FinishReason.MAX_TOKENS
        return None

    def finish(self, reason: FinishReason) -> None:
        """Stop early (cancel, deadline) if not already finished."""
        if self.finish_reason is None:
            self.finish_reason = reason

    def elapsed_ms(self) -> float:
        return (self._clock() - self.started) * 1e3

    def deadline_passed(self) -> bool:
        return self.deadline_ms > 0 and self.elapsed_ms() >= self.deadline_ms

    def stats(self, uplink_bytes: int = 0, downlink_bytes: int = 0) -> RequestStats:
        """Statistics so far, in vLLM's vocabulary."""
        hidden_accepted = 0
        for drafted, final in zip(self._hidden, self.committed, strict=False):
            if drafted != final:
                break
            hidden_accepted += 1
        c = self.counters
        hidden_accepted = min(hidden_accepted, c.accepted)
        ttft = (self.first_token_at - self.started) * 1e3 if self.first_token_at else 0.0
        return RequestStats(
            drafted=c.drafted,
            accepted=c.accepted,
            hidden_drafted=c.hidden_drafted,
            hidden_accepted=hidden_accepted,
            target_steps=c.steps,
            ttft_ms=ttft,
            total_ms=self.elapsed_ms(),
            uplink_bytes=uplink_bytes,
            downlink_bytes=downlink_bytes,
            new_tokens=len(self.committed),
            stale_drafts=c.stale,
            stage_ms=dict(c.stage_ms),
        )
