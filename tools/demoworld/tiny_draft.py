"""The ``tiny-random`` EventGPT: the project's draft class at tiny size, random weights.

Built in code in well under a second, so tests run the whole system with no files.
It imports the edge's model classes (the demo world builds them); the edge itself
never imports this module.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import CLIPVisionConfig

from eventspec.demoworld.tiny_tokenizer import tiny_fast_tokenizer
from eventspec.edge.drafting.checkpoint import save_draft
from eventspec.edge.drafting.eventgpt import DraftModel, EventGPTConfig, EventGPTForCausalLM

TINY_DRAFT_ID = "tiny-random-eventgpt"


def tiny_draft_config(vocab_size: int = 576) -> EventGPTConfig:
    """The tiny EventGPT: CLIP 32-d/2 layers at 28 px (5 tokens/frame), LLaMA 64-d."""
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
        projection_dim=32,
    )
    return EventGPTConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        mm_visual_tower=None,
        event_feature_adaptor=True,
        vision_config=vision.to_dict(),
        image_size=28,
    )


def build_tiny_random_draft(
    seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> DraftModel:
    """A deterministic tiny random EventGPT with the tiny ``draft`` tokenizer.

    Like the tiny target, it is initialised sharply (attention/MLP std 0.3, embeddings
    std 1.0): at the default std 0.02 a tiny random LM ignores its context, so a drafter
    whose KV cache held a token twice or missed one would still draft the same tokens,
    and the rollback tests would prove nothing. The global RNG is left untouched, so
    building a model never shifts a test's draws.
    """
    tokenizer = tiny_fast_tokenizer("draft")
    config = tiny_draft_config(vocab_size=_round_up(len(tokenizer), 64))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = EventGPTForCausalLM(config)
        with torch.no_grad():
            inner = model.model
            for part in (inner.layers, inner.visual_projector, inner.feature_adaptor):
                for module in part.modules():
                    if isinstance(module, torch.nn.Linear):
                        module.weight.normal_(0.0, 0.3)
            inner.embed_tokens.weight.normal_(0.0, 1.0)
            model.lm_head.weight.normal_(0.0, 0.1)
    model.to(device=torch.device(device), dtype=dtype)  # type: ignore[call-arg]
    return DraftModel(model, tokenizer, model_id=f"{TINY_DRAFT_ID}-{seed}")


def save_tiny_random_draft(directory: str | Path, seed: int = 0) -> Path:
    """Write the tiny random draft as an EventGPT directory that ``load_draft`` reads.

    This is how ``eventspec-edge serve --model tiny-random`` gets its model: the edge
    only ever loads a directory.
    """
    return save_draft(build_tiny_random_draft(seed), directory, layout="5.x", include_clip=True)


def write_scratch_draft(scratch: Path, seed: int) -> Path:
    """``eventspec-edge serve --model tiny-random``: the tiny random draft for ``seed``,
    written into the node's scratch directory, which the server loads like any other.

    The ``eventspec.builtin_models`` entry point ``edge.tiny-random`` (``pyproject.toml``):
    the edge's CLI finds it there, so it imports nothing from the demo world.
    """
    return save_tiny_random_draft(scratch / f"{TINY_DRAFT_ID}-{seed}", seed)


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple
