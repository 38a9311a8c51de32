"""The scorer role: what a target engine offers the scheduler.

An engine owns the forward passes and the KV memory; the scheduler and the sampler
only exchange token ids and float32 logits (on the device) with it. Keeping this a
``Protocol`` with no transformers import lets the scheduling and sampling logic be
tested against a fake engine, and lets a static-cache CUDA-graph engine replace the
reference HF engine without touching its callers.

Cache convention: after ``prefill`` the slot holds the prompt. The scheduler feeds the
last committed token plus the drafts to ``step``; the newest committed token is always
fed again at the next step (as vLLM and HF assisted decoding do), at position
``prompt + len(C) - 1``, which is therefore the step's start position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from eventspec.cloud.engine.ahead import AheadEmbeds
from eventspec.shared.node.static.batch import StepBatch

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
    #: The visual input's content hash (``eventspec.cloud.scheduling.prefix_cache.visual_key``),
    #: computed off the engine thread; None: the prefix cache hashes the tensor itself.
    visual_key: str | None = None
    #: Encoded frames not preprocessed yet: the request expected its clip's prefix in
    #: the cache, so no pixels are needed unless it misses (then the loop makes them).
    deferred_frames: tuple[bytes, ...] | None = None


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


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt positions ``start`` .. ``start + len(embeds) - 1`` of the request in
    ``slot``: ``embeds`` [n, H] are rows of its prompt embeddings
    (:meth:`ChunkedPrefillEngine.prompt_embeds`); ``token_ids``, when given, the
    prompt's ids at those rows (an engine may run text rows from them)."""

    slot: int
    start: int
    embeds: torch.Tensor  # [n, H]
    token_ids: tuple[int, ...] | None = None  # [n]


@runtime_checkable
class ChunkedPrefillEngine(Protocol):
    """An engine whose prefills can run in pieces, interleaved with steps, and whose
    slots can take a saved prompt prefix: what chunked prefill and prefix reuse need
    (the static engine; the scheduler falls back to whole prefills without it)."""

    def prompt_embeds(self, request: PrefillRequest, start: int = 0) -> torch.Tensor:
        """Rows ``start`` .. L - 1 of the request's prompt as [L - start, H] input
        embeddings (the visual rows from its video tower and projector, which does not
        run when no visual row is among them); checked like a prefill, no KV written."""
        ...

    def prefill_chunks(self, chunks: Sequence[PrefillChunk]) -> torch.Tensor:
        """Write each chunk's K/V into its slot (continuing what the slot holds); return
        [R, V] float32 logits of each chunk's last position."""
        ...

    def save_prefix(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the slot's first ``length`` prompt positions (copies)."""
        ...

    def load_prefix(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write a saved prefix into the slot's first positions."""
        ...


@runtime_checkable
class AheadEmbedsEngine(Protocol):
    """A chunked-prefill engine that can make a prompt's embeddings ahead of its first
    piece, beside the steps (:mod:`eventspec.cloud.engine.ahead`)."""

    def prompt_embeds_ahead(self, request: PrefillRequest, start: int = 0) -> AheadEmbeds:
        """:meth:`ChunkedPrefillEngine.prompt_embeds`, enqueued; checked first."""
        ...


@runtime_checkable
class KvByLengthEngine(Protocol):
    """An engine whose KV is one arena of positions (``eventspec.cloud.scheduling.kv_arena``): a
    slot id is a run's first position, and a session's run is reserved before use."""

    kv_positions: int | None  # the arena's positions; None: fixed slots after all

    def reserve(self, slot: int, positions: int) -> None:
        """The session starting at ``slot`` owns ``positions`` from there."""
        ...


@runtime_checkable
class MixedStepEngine(Protocol):
    """An engine that can run prompt chunks inside a step's forward (chunked prefill
    without a call of its own per chunk: Sarathi-Serve's stall-free batches)."""

    mixed_steps: bool  # False where the engine cannot now (e.g. batch-invariant)

    def step_with_chunks(self, batch: StepBatch, chunks: Sequence[PrefillChunk]
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """``step(batch)`` and ``prefill_chunks(chunks)`` in one forward: ([N, V] step
        logits, [R, V] logits of each chunk's last position)."""
        ...


@runtime_checkable
class MixedShapeEngine(Protocol):
    """A mixed-step engine that can say, after the call, whether its mixed step ran at
    one of its fixed shapes (replayed from a captured graph where graphs are on) or
    eagerly at exact shapes: the engine loop labels the latter's times apart
    (``eventspec.cloud.scheduling.step_kinds``). After, not before: the engine looks the
    shape up for the step anyway, and a question before it would look it up twice."""

    #: Whether the latest :meth:`MixedStepEngine.step_with_chunks` ran at a fixed shape.
    last_mixed_fixed: bool
