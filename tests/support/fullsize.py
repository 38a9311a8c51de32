"""The full-size Video-LLaVA-7B and EventGPT-7B architectures with random weights, for
GPU benchmarks.

CLIP ViT-L/14-224 video tower, LLaMA-7B text model, vocab 32064, built from config so
no checkpoint is needed: step and prefill timings do not depend on weight values. The
tokenizer is the tiny one with its special ids placed at 512/513, so the text vocabulary
the sampler may choose from is the tiny one (answers decode); only sizes matter here.
"""

from __future__ import annotations

import torch
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    VideoLlavaConfig,
    VideoLlavaForConditionalGeneration,
)

from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_tokenizer import TINY_TEXT_VOCAB_SIZE, tiny_fast_tokenizer
from eventspec.edge.drafting.eventgpt import DraftModel, EventGPTConfig, EventGPTForCausalLM

FULL_SIZE_ID = "video-llava-7b-shaped-random"


def full_size_config() -> VideoLlavaConfig:
    vision = CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                              num_attention_heads=16, image_size=224, patch_size=14,
                              projection_dim=768)
    text = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
                       max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                       pad_token_id=TINY_TEXT_VOCAB_SIZE + 2)
    return VideoLlavaConfig(vision_config=vision, text_config=text,
                            image_token_index=TINY_TEXT_VOCAB_SIZE,
                            video_token_index=TINY_TEXT_VOCAB_SIZE + 1,
                            vision_feature_layer=-2, vision_feature_select_strategy="default",
                            image_seq_length=256, video_seq_length=8 * 257)


def build_full_target(device: str, dtype: torch.dtype = torch.bfloat16) -> TargetModel:
    """The 7B-shaped target, initialised directly on ``device`` in ``dtype``."""
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = VideoLlavaForConditionalGeneration(full_size_config())
    finally:
        torch.set_default_dtype(torch.float32)
    model.train(False)
    return TargetModel(model, tiny_fast_tokenizer("target"), FULL_SIZE_ID)


FULL_DRAFT_ID = "eventgpt-7b-shaped-random"


def full_draft_config() -> EventGPTConfig:
    """EventGPT-7B's shapes: CLIP ViT-L/14-336 (577 tokens per frame) and LLaMA-7B."""
    vision = CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                              num_attention_heads=16, image_size=336, patch_size=14,
                              projection_dim=768)
    return EventGPTConfig(vocab_size=32064, hidden_size=4096, intermediate_size=11008,
                          num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                          max_position_embeddings=4096, tie_word_embeddings=False,
                          mm_visual_tower=None, event_feature_adaptor=True,
                          vision_config=vision.to_dict(), image_size=336)


def build_full_draft(device: str, dtype: torch.dtype = torch.bfloat16) -> DraftModel:
    """The 7B-shaped EventGPT drafter, initialised directly on ``device`` in ``dtype``
    (random weights: drafting speed does not depend on their values)."""
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = EventGPTForCausalLM(full_draft_config())
    finally:
        torch.set_default_dtype(torch.float32)
    return DraftModel(model, tiny_fast_tokenizer("draft"), FULL_DRAFT_ID)
