"""The one KV-crop helper (shared/node/kvcache.py), on real DynamicCaches and both tiny models.

The crop is the edge's rollback after a Commit and the cloud engine's implicit rollback
to a step's start. A crop that keeps one position too many or too few changes every
later logit, so the model tests compare the logits after crop + re-feed with those of
a fresh, uncached forward over the same sequence.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_draft import build_tiny_random_draft
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.kvcache import CroppableCache, cache_kwarg, crop_cache

QUESTION = "Is it dark?"


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


@pytest.fixture(scope="module")
def draft() -> DraftModel:
    return build_tiny_random_draft(seed=0)


def _filled_cache(length: int, layers: int = 2) -> tuple[DynamicCache, list[torch.Tensor]]:
    """A DynamicCache holding ``length`` random positions per layer, and its keys [1, 2, L, 4]."""
    cache = DynamicCache()
    keys = []
    gen = torch.Generator().manual_seed(length)
    for layer in range(layers):
        k = torch.randn(1, 2, length, 4, generator=gen)  # [B, heads, L, head_dim]
        v = torch.randn(1, 2, length, 4, generator=gen)
        cache.update(k, v, layer)
        keys.append(k)
    return cache, keys


def test_dynamic_cache_is_a_croppable_cache() -> None:
    cache: CroppableCache = DynamicCache()  # the Protocol the helper is typed against
    assert cache.get_seq_length() == 0


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 12), keep=st.integers(-3, 15), floor=st.integers(-2, 12))
def test_crop_keeps_exactly_the_prefix_or_refuses(length: int, keep: int, floor: int) -> None:
    cache, keys = _filled_cache(length)
    if not max(floor, 0) <= keep <= length:
        with pytest.raises(InvalidInput, match="roll back"):
            crop_cache(cache, keep, floor=floor)
        assert cache.get_seq_length() == length  # a refusal leaves the cache whole
        return
    crop_cache(cache, keep, floor=floor)
    assert cache.get_seq_length() == keep
    for layer, k in enumerate(keys):
        assert torch.equal(cache.layers[layer].keys, k[:, :, :keep])


def test_refusal_names_the_prompt_floor() -> None:
    cache, _ = _filled_cache(10)
    with pytest.raises(InvalidInput, match="holds 10, 6 of them prompt"):
        crop_cache(cache, 5, floor=6)


def _target_logits(target: TargetModel, ids: list[int], pix: torch.Tensor,
                   cache: DynamicCache | None) -> torch.Tensor:
    with torch.inference_mode():
        out = target.model(input_ids=torch.tensor([ids]), pixel_values_videos=pix,
                           **{cache_kwarg(target.model): cache}, use_cache=cache is not None)
    logits: torch.Tensor = out.logits[0].float()  # [len(ids), V]
    return logits


@pytest.mark.parametrize("keep_extra", [0, 1, 4])
def test_target_logits_after_crop_equal_a_fresh_prefill(target: TargetModel,
                                                        keep_extra: int) -> None:
    pix = torch.randn(1, 8, 3, 32, 32, generator=torch.Generator().manual_seed(keep_extra))
    prompt = target.build_prompt_ids(QUESTION)
    fed, new = [5, 6, 7, 8, 9], [42, 43]
    cache = DynamicCache(config=target.model.config)
    _target_logits(target, prompt + fed, pix, cache)
    crop_cache(cache, len(prompt) + keep_extra, floor=len(prompt))
    with torch.inference_mode():
        after = target.model(input_ids=torch.tensor([new]), **{cache_kwarg(target.model): cache},
                             use_cache=True).logits[0].float()  # [2, V]
    fresh = _target_logits(target, prompt + fed[:keep_extra] + new, pix, None)  # [L, V]
    torch.testing.assert_close(after, fresh[-len(new):], rtol=1e-5, atol=1e-5)
    assert cache.get_seq_length() == len(prompt) + keep_extra + len(new)


def test_draft_logits_after_crop_equal_a_fresh_prefill(draft: DraftModel) -> None:
    pixels = torch.randn(5, 3, 28, 28, generator=torch.Generator().manual_seed(1))
    state, _ = draft.prefill(QUESTION, pixels)
    p = state.prompt_len
    draft.step(state, [11, 12, 13, 14])
    crop_cache(state.cache, p + 2, floor=p)
    after = draft.step(state, [30])  # [1, V]
    fresh_state, _ = draft.prefill(QUESTION, pixels)
    fresh = draft.step(fresh_state, [11, 12, 30])  # [3, V]
    torch.testing.assert_close(after[0], fresh[-1], rtol=1e-5, atol=1e-5)
    assert draft.seq_len(state) == draft.seq_len(fresh_state)


def test_crop_to_zero_and_equal_length(target: TargetModel) -> None:
    cache = DynamicCache(config=target.model.config)
    pix = torch.randn(1, 8, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    _target_logits(target, target.build_prompt_ids(QUESTION), pix, cache)
    length = cache.get_seq_length()
    crop_cache(cache, length)  # equal: no-op
    assert cache.get_seq_length() == length
    crop_cache(cache, 0)
    assert cache.get_seq_length() == 0
