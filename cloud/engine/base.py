"""The scorer role: what a target engine offers the scheduler.

An engine owns the forward passes and the KV cache layout; the scheduler and the
verifier only exchange token ids and float32 logits with it. Keeping this a
``Protocol`` with no transformers import lets the scheduling and verification logic
be tested against a fake engine, and lets a static-cache CUDA-graph engine replace
the reference HF engine without touching its callers.

Cache convention: after ``prefill`` the cache holds the prompt. The caller feeds the
last committed token plus the drafts to ``step``; the engine appends them all, and
the caller ``rollback``\\s to the committed length minus one (the newest committed
token is always fed again at the next step, as vLLM and HF assisted decoding do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass
class EngineState:
    """One session's engine-side state: an opaque cache and how many positions it holds.

    Mutable on purpose: ``step`` and ``rollback`` update it in place. ``cache`` is
    None once released.
    """

    cache: object | None
    length: int

    @property
    def released(self) -> bool:
        """True after ``release``: the cache memory has been given back."""
        return self.cache is None


@runtime_checkable
class TargetEngine(Protocol):
    """Forward passes of the target over one session's KV cache.

    Calls are synchronous and may take tens of milliseconds; the async server runs
    them in a worker thread. Logits are float32 on the CPU, unmasked: callers apply
    ``cloud.verify.mask_non_text`` so speculative and target-only decoding agree.
    """

    def prefill(
        self,
        input_ids: Sequence[int],
        *,
        pixel_values_videos: torch.Tensor | None = None,
        video_features: torch.Tensor | None = None,
    ) -> tuple[EngineState, torch.Tensor]:
        """Run the prompt with exactly one visual input; return (state, logits [V]).

        ``pixel_values_videos`` is [1, F, 3, S, S]; ``video_features`` are the video
        tower's selected-layer features [F, T, D], before the projector (the engine
        projects and injects them in place of the tower). The logits are for the token
        after the prompt; the state's cache then holds the prompt.
        """
        ...

    def step(self, state: EngineState, tokens: Sequence[int]) -> torch.Tensor:
        """Append ``tokens`` (at least one) to the cache; return logits [len(tokens), V]."""
        ...

    def rollback(self, state: EngineState, keep_len: int) -> None:
        """Keep only the first ``keep_len`` cached positions (0 <= keep_len <= length)."""
        ...

    def release(self, state: EngineState) -> None:
        """Free the session's cache; idempotent, and the state may not be stepped again."""
        ...

    def seq_len(self, state: EngineState) -> int:
        """How many positions the session's cache holds."""
        ...


# -- the batched engine API (the scheduler's seam) ----------------------------------------
#
# Every ready session is stepped in one call. Sessions live in KV *slots* that the engine
# reserves at start-up; the scheduler owns which slot belongs to which request. A step
# names, per session, how many cached positions are valid (``start_positions``): the
# engine writes the session's new tokens at [start, start + count) and attends causally
# over [0, start + count). Anything cached beyond ``start`` is garbage and never read,
# so a rejected draft needs no rollback call (vLLM V1 and SGLang treat rejected KV the
# same way). Results stay on the device until the sampler has reduced them.


@dataclass(frozen=True)
class PrefillRequest:
    """One prompt to prefill into ``slot`` (the slot's previous content is discarded)."""

    slot: int
    input_ids: Sequence[int]  # the whole prompt, <video> placeholders included
    pixel_values_videos: torch.Tensor | None = None  # [1, F, 3, S, S]
    video_features: torch.Tensor | None = None  # [F, T, D], the tower's selected layer


@dataclass(frozen=True)
class StepBatch:
    """Flattened tokens of B sessions, with per-session counts (vLLM's cu_num_draft_tokens).

    ``token_ids`` holds, for each session in order, its last committed token followed by
    its drafts: ``counts[i]`` ids (at least 1) for ``slots[i]``, written at positions
    ``start_positions[i] ...`` of that slot.
    """

    slots: tuple[int, ...]  # [B]
    start_positions: tuple[int, ...]  # [B]
    counts: tuple[int, ...]  # [B], each >= 1
    token_ids: torch.Tensor  # [N = sum(counts)] int64, on the engine's device

    @property
    def num_tokens(self) -> int:
        return sum(self.counts)


@runtime_checkable
class BatchedEngine(Protocol):
    """The target's forward passes over slot-owned KV memory, many sessions per call.

    Synchronous; one engine thread calls it. Logits are float32 on ``device``, unmasked:
    the sampler masks ids outside the text vocabulary.
    """

    device: torch.device
    num_slots: int  # KV slots reserved at start-up
    max_seq_len: int  # positions per slot

    def prefill(self, requests: Sequence[PrefillRequest]) -> torch.Tensor:
        """Prefill each request into its slot; return [R, V] logits of each prompt's
        last position (the distribution of the first answer token)."""
        ...

    def step(self, batch: StepBatch) -> torch.Tensor:
        """Write ``batch``'s tokens into their slots; return [N, V] logits, row i for
        flat token i (the distribution of the token after it)."""
        ...

    def free(self, slot: int) -> None:
        """Forget the slot's content; idempotent. The slot can be prefilled again."""
        ...
