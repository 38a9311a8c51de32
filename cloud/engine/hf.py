"""The reference engine: HF eager forward passes, one ``DynamicCache`` per KV slot.

It is the correctness oracle every faster engine is tested against, so it does the
simplest thing behind the batched API: it loops over the sessions of a batch, crops
each slot's cache to the step's start position (rollback is implicit in the API) and
runs the model's own forward on that session's tokens. Prefill uses the model's forward
with pixels, or an ``inputs_embeds`` prefill for aligned features that performs exactly
the scatter the model does for pixels. Python overhead, not the GPU, bounds it
(REFERENCE.md: 20-22 ms per step for any k <= 64 at 7B), and a batch of B costs B steps.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.target import TargetModel
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput
from eventspec.shared.node.kvcache import cache_kwarg, crop_cache
from eventspec.shared.node.static.batch import StepBatch

logger = logging.getLogger(__name__)


class HFEngine:
    """``BatchedEngine`` over a ``TargetModel`` with HF eager forwards, looping over slots.

    Synchronous; one engine thread calls it (the model's forward is not re-entrant on
    GPU). ``num_slots`` and ``max_seq_len`` come from the KV plan (``eventspec.cloud.engine.kv``):
    a ``DynamicCache`` grows on demand, so the reservation is an admission budget that
    the scheduler enforces, not preallocated memory.
    """

    def __init__(self, target: TargetModel, *, num_slots: int = 8,
                 max_seq_len: int | None = None):
        if num_slots < 1:
            raise InvalidInput(f"num_slots must be >= 1, got {num_slots}")
        self.target = target
        self.model = target.model
        self.device: torch.device = target.device
        self.num_slots = num_slots
        self.max_seq_len = min(max_seq_len or target.max_positions, target.max_positions)
        self._caches: list[DynamicCache | None] = [None] * num_slots
        self._cache_kw = cache_kwarg(self.model)

    # -- the batched API -----------------------------------------------------------------

    def prefill(self, requests: Sequence[PrefillRequest]) -> torch.Tensor:
        """Prefill each request into its slot; return [R, V] float32 logits on the device."""
        if not requests:
            raise InvalidInput("prefill needs at least one request")
        rows = [self._prefill_one(r) for r in requests]  # R x [V]
        return torch.stack(rows)  # [R, V]

    def step(self, batch: StepBatch) -> torch.Tensor:
        """Write each session's tokens at its start position; return [N, V] float32 logits."""
        self._check_batch(batch)
        rows: list[torch.Tensor] = []
        offset = 0
        for slot, start, count in zip(batch.slots, batch.start_positions, batch.counts,
                                      strict=True):
            cache = self._live(slot)
            crop_cache(cache, start)  # drop rejected positions: rollback is implicit
            ids = batch.token_ids[offset : offset + count].unsqueeze(0)  # [1, count]
            offset += count
            with torch.inference_mode():
                out = self.model(input_ids=ids.to(self.device), use_cache=True,
                                 **{self._cache_kw: cache})
            rows.append(out.logits[0].float())  # [count, V]
        return torch.cat(rows)  # [N, V]

    def free(self, slot: int) -> None:
        """Drop the slot's cache so its memory can be reused; idempotent."""
        self._check_slot(slot)
        self._caches[slot] = None

    # -- helpers -------------------------------------------------------------------------

    def cached_len(self, slot: int) -> int:
        """Positions the slot's cache holds (0 when free); for tests and diagnostics."""
        self._check_slot(slot)
        cache = self._caches[slot]
        return 0 if cache is None else int(cache.get_seq_length())

    def _prefill_one(self, req: PrefillRequest) -> torch.Tensor:
        self._check_slot(req.slot)
        if (req.pixel_values_videos is None) == (req.video_features is None):
            raise InvalidInput("prefill needs exactly one of pixel_values_videos or video_features")
        ids = self._check_prompt(req.input_ids)
        ids_t = torch.tensor([ids], dtype=torch.long, device=self.device)  # [1, L]
        cache = DynamicCache(config=self.model.config)
        self._caches[req.slot] = None
        with torch.inference_mode():
            if req.pixel_values_videos is not None:
                pix = self._check_pixels(req.pixel_values_videos)  # [1, F, 3, S, S]
                out = self.model(input_ids=ids_t, pixel_values_videos=pix, use_cache=True,
                                 logits_to_keep=1, **{self._cache_kw: cache})
            else:
                assert req.video_features is not None
                embeds = self._embed_with_features(ids_t, req.video_features)  # [1, L, H]
                out = self.model(inputs_embeds=embeds, use_cache=True, logits_to_keep=1,
                                 **{self._cache_kw: cache})
        self._caches[req.slot] = cache
        logger.debug("prefill of %d tokens into slot %d", len(ids), req.slot)
        row: torch.Tensor = out.logits[0, -1].float()  # [V]
        return row

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise InvalidInput(f"slot {slot} outside 0..{self.num_slots - 1}")

    def _live(self, slot: int) -> DynamicCache:
        self._check_slot(slot)
        cache = self._caches[slot]
        if cache is None:
            raise FailedPrecondition(f"slot {slot} was not prefilled (or was freed)")
        return cache

    def _check_batch(self, batch: StepBatch) -> None:
        b = len(batch.slots)
        if b == 0 or len(batch.start_positions) != b or len(batch.counts) != b:
            raise InvalidInput(
                f"StepBatch needs as many slots, start_positions and counts (>= 1), got "
                f"{b}, {len(batch.start_positions)}, {len(batch.counts)}"
            )
        if len(set(batch.slots)) != b:
            raise InvalidInput(f"StepBatch.slots repeats a slot: {list(batch.slots)}")
        if any(c < 1 for c in batch.counts):
            raise InvalidInput(f"StepBatch.counts must each be >= 1, got {list(batch.counts)}")
        if tuple(batch.token_ids.shape) != (batch.num_tokens,):
            raise InvalidInput(
                f"StepBatch.token_ids must be [{batch.num_tokens}], "
                f"got {list(batch.token_ids.shape)}"
            )
        vocab = self.target.text_vocab_size
        if batch.num_tokens and (
            int(batch.token_ids.min()) < 0 or int(batch.token_ids.max()) >= vocab
        ):
            raise InvalidInput(f"StepBatch.token_ids must be text ids below {vocab}")
        for slot, start, count in zip(batch.slots, batch.start_positions, batch.counts,
                                      strict=True):
            held = int(self._live(slot).get_seq_length())
            if not 0 <= start <= held:
                raise InvalidInput(
                    f"StepBatch.start_positions: slot {slot} starts at {start} but holds {held}"
                )
            if start + count > self.max_seq_len:
                raise InvalidInput(
                    f"StepBatch: slot {slot} would reach {start + count} positions, "
                    f"beyond max_seq_len {self.max_seq_len}"
                )

    def _check_prompt(self, input_ids: Sequence[int]) -> list[int]:
        t = self.target
        ids = [int(i) for i in input_ids]
        if not ids:
            raise InvalidInput("the prompt is empty")
        if len(ids) >= self.max_seq_len:
            raise InvalidInput(
                f"prompt of {len(ids)} tokens exceeds the {self.max_seq_len} positions of a slot"
            )
        n_video = sum(1 for i in ids if i == t.video_token_id)
        if n_video != t.geometry.visual_tokens:
            raise InvalidInput(
                f"the prompt has {n_video} <video> placeholders, "
                f"the target needs {t.geometry.visual_tokens}"
            )
        bad = [i for i in ids if not (0 <= i < t.text_vocab_size or i == t.video_token_id)]
        if bad:
            raise InvalidInput(f"prompt holds ids that are neither text nor <video>: {bad[:4]}")
        return ids

    def _check_pixels(self, pixel_values_videos: torch.Tensor) -> torch.Tensor:
        g = self.target.geometry
        expected = (1, g.num_frames, 3, g.image_size, g.image_size)
        if tuple(pixel_values_videos.shape) != expected:
            raise InvalidInput(
                f"pixel_values_videos must be {list(expected)}, "
                f"got {list(pixel_values_videos.shape)}"
            )
        return pixel_values_videos.to(self.device, self.target.dtype)

    def _embed_with_features(
        self, ids_t: torch.Tensor, video_features: torch.Tensor
    ) -> torch.Tensor:
        """Token embeddings with projected features scattered into the <video> slots.

        The same ``masked_scatter`` the model applies to its own tower output, so the
        result matches the pixel path exactly when the features came from the tower.
        """
        projected = self.target.project_video_features(video_features)  # [F, T, H]
        embeds = self.model.get_input_embeddings()(ids_t)  # [1, L, H]
        mask = (ids_t == self.target.video_token_id).unsqueeze(-1)  # [1, L, 1]
        merged: torch.Tensor = embeds.masked_scatter(mask, projected.to(embeds.dtype))
        return merged  # [1, L, H]
