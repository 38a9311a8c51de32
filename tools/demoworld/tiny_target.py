"""The ``tiny-random`` Video-LLaVA: the real target class at tiny size, random weights.

Built in code in well under a second, so tests run the whole system with no files.
It imports the cloud's model wrapper (the demo world builds it); the cloud itself
never imports this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    VideoLlavaConfig,
    VideoLlavaForConditionalGeneration,
)

from eventspec.cloud.target import TargetModel, save_target
from eventspec.demoworld.tiny_tokenizer import TINY_TEXT_VOCAB_SIZE, tiny_fast_tokenizer
from eventspec.demoworld.tokenizer import BOS_ID, EOS_ID

TINY_TARGET_ID = "tiny-random-video-llava"


def tiny_target_config() -> VideoLlavaConfig:
    """Real Video-LLaVA shape rules at tiny sizes.

    8 frames of 32 px with 8 px patches give 17 tokens per frame (CLS kept), 136
    placeholders; the vocabulary is the tiny tokenizer's 512 text ids plus
    ``<image>`` 512, ``<video>`` 513, ``<pad>`` 514, padded to 576 like 32064 at 7B.
    """
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        projection_dim=32,
    )
    text = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=_round_up(TINY_TEXT_VOCAB_SIZE + 3, 64),
        max_position_embeddings=4096,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=TINY_TEXT_VOCAB_SIZE + 2,
    )
    tokens_per_frame = (32 // 8) ** 2 + 1
    return VideoLlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=TINY_TEXT_VOCAB_SIZE,
        video_token_index=TINY_TEXT_VOCAB_SIZE + 1,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_seq_length=tokens_per_frame - 1,
        video_seq_length=8 * tokens_per_frame,
    )


def build_tiny_random_target(
    seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> TargetModel:
    """Build the tiny target with seeded random weights.

    Default initialisation (std 0.02) makes a tiny random LM input-blind: attention is
    near uniform, the residual stream is the current token's embedding, and greedy
    decoding replays one fixed chain whatever the question or frames. Sharper
    attention/MLP weights (std 0.3), wider embeddings and projector make
    continuations depend on the whole prompt, which the losslessness tests need to be
    meaningful. The global RNG is left untouched.
    """
    config = tiny_target_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = VideoLlavaForConditionalGeneration(config)
        with torch.no_grad():
            for module in model.model.language_model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.normal_(0.0, 0.3)
            model.model.language_model.embed_tokens.weight.normal_(0.0, 1.0)
            model.lm_head.weight.normal_(0.0, 0.1)
            for linear in (
                model.model.multi_modal_projector.linear_1,
                model.model.multi_modal_projector.linear_2,
            ):
                linear.weight.normal_(0.0, 0.3)
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = TINY_TEXT_VOCAB_SIZE + 2
    movable: Any = model  # transformers' decorator hides ``to``'s signature from mypy
    movable.to(device=device, dtype=dtype)
    return TargetModel(model, tiny_fast_tokenizer("target"), model_id=TINY_TARGET_ID)


def save_tiny_random_target(directory: str | Path, seed: int = 0) -> Path:
    """Write the tiny random target as a Video-LLaVA directory that ``load_target`` reads.

    This is how ``eventspec-cloud serve --model tiny-random`` gets its model: the cloud
    only ever loads a directory.
    """
    return save_target(build_tiny_random_target(seed), directory)


def write_scratch_target(scratch: Path, seed: int) -> Path:
    """``eventspec-cloud serve --model tiny-random``: the tiny random target for ``seed``,
    written into the node's scratch directory, which the server loads like any other.

    The ``eventspec.builtin_models`` entry point ``cloud.tiny-random``
    (``pyproject.toml``): the cloud's CLI finds it there, so it imports nothing from the
    demo world.
    """
    return save_tiny_random_target(scratch / TINY_TARGET_ID, seed)


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple
