"""The reference engine: HF eager forward passes over a ``DynamicCache``.

It is the correctness baseline every faster engine is tested against, so it does
the simplest thing: one ``DynamicCache`` per session, the model's own forward for
prefill (pixels) and steps, and an ``inputs_embeds`` prefill for aligned features
that performs exactly the scatter the model does for pixels. Python overhead, not
the GPU, bounds it (REFERENCE.md: 20-22 ms per step for any k <= 64 at 7B).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from cloud.engine.base import EngineState
from cloud.target import TargetModel
from shared.errors import FailedPrecondition, InvalidInput

logger = logging.getLogger(__name__)


def crop_cache(cache: DynamicCache, keep_len: int) -> None:
    """Keep the first ``keep_len`` positions of ``cache``, on transformers 5.17 and 5.23.

    In 5.x ``Cache.crop(n)`` takes a negative ``n``: the count of positions to drop
    (5.23 raises on a positive one; 4.x read it as an absolute length). So the count
    is always computed here, and equal lengths are a no-op.
    """
    length = cache.get_seq_length()
    if keep_len < 0 or keep_len > length:
        raise InvalidInput(f"cannot roll back to {keep_len} positions: the cache holds {length}")
    if keep_len == length:
        return
    cache.crop(keep_len - length)


class HFEngine:
    """``TargetEngine`` over a ``TargetModel`` with HF eager forwards.

    Synchronous; run it in a worker thread. One instance serves many sessions, each
    with its own ``EngineState``; calls for different sessions must not overlap (the
    scheduler serialises them), since the model's forward is not re-entrant on GPU.
    """

    def __init__(self, target: TargetModel) -> None:
        self.target = target
        self.model = target.model

    def prefill(
        self,
        input_ids: Sequence[int],
        *,
        pixel_values_videos: torch.Tensor | None = None,
        video_features: torch.Tensor | None = None,
    ) -> tuple[EngineState, torch.Tensor]:
        """Run the prompt over a fresh cache; return (state, logits [V] float32, CPU)."""
        if (pixel_values_videos is None) == (video_features is None):
            raise InvalidInput("prefill needs exactly one of pixel_values_videos or video_features")
        ids = self._check_prompt(input_ids)
        ids_t = torch.tensor([ids], dtype=torch.long, device=self.target.device)  # [1, L]
        cache = DynamicCache(config=self.model.config)
        with torch.inference_mode():
            if pixel_values_videos is not None:
                pix = self._check_pixels(pixel_values_videos)  # [1, F, 3, S, S]
                out = self.model(
                    input_ids=ids_t,
                    pixel_values_videos=pix,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
            else:
                assert video_features is not None
                embeds = self._embed_with_features(ids_t, video_features)  # [1, L, H]
                out = self.model(
                    inputs_embeds=embeds, past_key_values=cache, use_cache=True, logits_to_keep=1
                )
        logits = out.logits[0, -1].float().cpu()  # [V]
        logger.debug("prefill of %d tokens", len(ids))
        return EngineState(cache=cache, length=len(ids)), logits

    def step(self, state: EngineState, tokens: Sequence[int]) -> torch.Tensor:
        """Append ``tokens`` to the cache; return logits [len(tokens), V] float32 on CPU."""
        cache = self._live_cache(state)
        toks = [int(t) for t in tokens]
        if not toks:
            raise InvalidInput("step needs at least one token")
        bad = [t for t in toks if not 0 <= t < self.target.text_vocab_size]
        if bad:
            raise InvalidInput(
                f"step tokens must be text ids below {self.target.text_vocab_size}, got {bad[:4]}"
            )
        if state.length + len(toks) > self.target.max_positions:
            raise InvalidInput(
                f"sequence would reach {state.length + len(toks)} positions, "
                f"beyond the model's {self.target.max_positions}"
            )
        ids_t = torch.tensor([toks], dtype=torch.long, device=self.target.device)  # [1, k]
        with torch.inference_mode():
            out = self.model(input_ids=ids_t, past_key_values=cache, use_cache=True)
        state.length += len(toks)
        logits: torch.Tensor = out.logits[0].float().cpu()  # [k, V]
        return logits

    def rollback(self, state: EngineState, keep_len: int) -> None:
        """Drop cached positions beyond ``keep_len``."""
        cache = self._live_cache(state)
        if keep_len > state.length:
            raise InvalidInput(
                f"cannot roll back to {keep_len} positions: the cache holds {state.length}"
            )
        crop_cache(cache, keep_len)
        state.length = keep_len

    def release(self, state: EngineState) -> None:
        """Drop the cache so its memory can be reused; safe to call twice."""
        state.cache = None
        state.length = 0

    def seq_len(self, state: EngineState) -> int:
        """Positions held by the session's cache."""
        return state.length

    # -- validation helpers --------------------------------------------------------

    def _live_cache(self, state: EngineState) -> DynamicCache:
        if state.cache is None:
            raise FailedPrecondition("the engine state was released")
        if not isinstance(state.cache, DynamicCache):
            raise FailedPrecondition(
                f"state holds a {type(state.cache).__name__}, not a DynamicCache"
            )
        return state.cache

    def _check_prompt(self, input_ids: Sequence[int]) -> list[int]:
        t = self.target
        ids = [int(i) for i in input_ids]
        if not ids:
            raise InvalidInput("the prompt is empty")
        if len(ids) >= t.max_positions:
            raise InvalidInput(f"prompt of {len(ids)} tokens exceeds {t.max_positions} positions")
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
        return pixel_values_videos.to(self.target.device, self.target.dtype)

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
