"""Video-LLaVA's language model as the static runtime sees it.

Thin adapters over :mod:`eventspec.shared.node.static.weights`, which knows any LLaMA
decoder: here the decoder is ``model.model.language_model`` and the head ``model.lm_head``.
"""

from __future__ import annotations

from typing import Any

import torch

from eventspec.cloud.target import TargetModel
from eventspec.shared.node.static.weights import (
    LanguageWeights,
    fuse_llama_weights,
    llama_unsupported_reason,
)
from eventspec.shared.node.static.weights import rope_tables as llama_rope_tables


def _decoder(target: TargetModel) -> tuple[Any, Any]:
    model: Any = target.model
    return getattr(getattr(model, "model", None), "language_model", None), getattr(
        model, "lm_head", None
    )


def static_unsupported_reason(target: TargetModel) -> str | None:
    """Why the static engine cannot serve ``target`` (None when it can)."""
    decoder, lm_head = _decoder(target)
    if decoder is None:
        return "the model has no model.language_model.layers / lm_head"
    model_type = getattr(decoder.config, "model_type", None)
    if model_type != "llama":
        return f"the language model is {model_type!r}, not 'llama'"
    return llama_unsupported_reason(decoder, lm_head)


def fuse_language_weights(target: TargetModel) -> LanguageWeights:
    """The target's language model with fused q/k/v and gate/up (storage shared)."""
    decoder, lm_head = _decoder(target)
    return fuse_llama_weights(decoder, lm_head)


def rope_tables(target: TargetModel, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, D] of the target's rotary embedding, in its dtype."""
    decoder, _ = _decoder(target)
    return llama_rope_tables(decoder, max_seq_len, target.device, target.dtype)
