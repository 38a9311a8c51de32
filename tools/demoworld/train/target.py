"""Training the toy target: a small Video-LLaVA that answers questions about toy scenes.

The shipped default target is ``VideoLlavaForConditionalGeneration`` at toy size,
trained on RGB clips of toy scenes to answer templated questions (direction, shape,
colour, count, moving). It sees colour and motion; the edge's EventGPT, trained on the
same questions from events, sees motion and edges but no colour, so drafts agree where
events carry the information and get corrected where they don't.

Frames go through the same path as in the running system: the 8 clip frames, JPEG at
the edge's default quality, decoded and CLIP-normalised at the tower's size. Run it
through ``eventspec toy train``.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    CLIPVisionConfig,
    LlamaConfig,
    VideoLlavaConfig,
    VideoLlavaForConditionalGeneration,
)

from eventspec.cloud.target import TargetModel, save_target
from eventspec.demoworld.tokenizer import BOS_ID, EOS_ID
from eventspec.demoworld.toy_tokenizer import TOY_TEXT_VOCAB_SIZE, toy_fast_tokenizer
from eventspec.demoworld.train.common import (
    AuxHeads,
    TrainProgress,
    accuracy_by_type,
    device_name,
    examples_for,
    lr_at,
    normalise,
    optimise,
    seed_everything,
    write_card,
)
from eventspec.demoworld.train.settings import ModelTraining
from eventspec.shared.node.imageproc import decode_image, encode_jpeg
from eventspec.shared.toyworld.labels import HEADS, attribute_labels
from eventspec.shared.toyworld.qa import QA
from eventspec.shared.toyworld.scenes import clip_frames, sample_scene

log = logging.getLogger("eventspec.toy.target")

TOY_MODEL_ID = "toy-video-llava"
IMAGE_SIZE, PATCH = 64, 16
NUM_FRAMES = 8
JPEG_QUALITY = 90  # the edge's default


def toy_target_config(text_vocab_size: int = TOY_TEXT_VOCAB_SIZE) -> VideoLlavaConfig:
    """Video-LLaVA's shape rules at toy size: 8 frames of 64 px, 16 px patches (17 tokens
    per frame with CLS, 136 video tokens), a 3-layer CLIP and a 3-layer LLaMA."""
    vision = CLIPVisionConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                              num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH,
                              projection_dim=128)
    vocab = (text_vocab_size + 3 + 63) // 64 * 64
    text = LlamaConfig(hidden_size=192, intermediate_size=512, num_hidden_layers=3,
                       num_attention_heads=6, num_key_value_heads=6, vocab_size=vocab,
                       max_position_embeddings=512, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                       pad_token_id=text_vocab_size + 2, tie_word_embeddings=False)
    per_frame = (IMAGE_SIZE // PATCH) ** 2 + 1
    return VideoLlavaConfig(vision_config=vision, text_config=text,
                            image_token_index=text_vocab_size,
                            video_token_index=text_vocab_size + 1,
                            vision_feature_layer=-2, vision_feature_select_strategy="default",
                            image_seq_length=per_frame - 1,
                            video_seq_length=NUM_FRAMES * per_frame)


def build_untrained_toy_target(seed: int, device: str = "cpu") -> TargetModel:
    """The toy architecture with seeded random weights (the start of training)."""
    torch.manual_seed(seed)
    model = VideoLlavaForConditionalGeneration(toy_target_config())
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = TOY_TEXT_VOCAB_SIZE + 2
    model.to(device)  # type: ignore[arg-type]
    return TargetModel(model, toy_fast_tokenizer("target"), TOY_MODEL_ID)


# -- data -----------------------------------------------------------------------------------


def scene_frames(seed: int) -> np.ndarray:
    """The 8 clip frames as the cloud receives them: JPEG round trip. [8, H, W, 3] uint8."""
    scene = sample_scene(seed)
    return np.stack([decode_image(encode_jpeg(f, JPEG_QUALITY)) for f in clip_frames(scene)])


def frames_for(seeds: Sequence[int], workers: int) -> np.ndarray:
    """Frames of many scenes, in parallel. [N, 8, H, W, 3] uint8."""
    if workers <= 1:
        return np.stack([scene_frames(s) for s in seeds])
    with ProcessPoolExecutor(workers) as pool:
        return np.stack(list(pool.map(scene_frames, seeds, chunksize=64)))


def encode_examples(
    target: TargetModel, items: Sequence[tuple[int, QA]]
) -> list[tuple[int, list[int], list[int]]]:
    """(scene index, prompt + answer + EOS ids, labels: -100 on the prompt)."""
    tok = target.tokenizer
    cache: dict[str, list[int]] = {}
    out = []
    for i, qa in items:
        if qa.question not in cache:
            cache[qa.question] = target.build_prompt_ids(qa.question)
        prompt = cache[qa.question]
        answer = [*tok(qa.answer, add_special_tokens=False).input_ids, target.eos_token_id]
        out.append((i, prompt + answer, [-100] * len(prompt) + answer))
    return out


def batch_tensors(
    rows: Sequence[tuple[int, list[int], list[int]]], pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Right-padded ids, attention mask, labels (answer + EOS only), scene indices."""
    width = max(len(r) for _, r, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (_, r, lb) in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(lb)] = torch.tensor(lb)
        mask[i, : len(r)] = 1
    return ids.to(device), mask.to(device), lab.to(device), [i for i, _, _ in rows]


# -- training -------------------------------------------------------------------------------


def forward_with_features(
    target: TargetModel, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
    pix: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LM loss with the video tower run once; also returns its selected-layer features.

    Same computation as the model's own pixel path (the selected layer, the projector,
    scattered into the ``<video>`` positions), but the features stay available for the
    auxiliary heads. Returns (lm loss, features [B, F, T, D]).
    """
    model = target.model
    b, f = pix.shape[:2]
    tower = model.model.video_tower(pix.flatten(0, 1), output_hidden_states=True)
    feats = tower.hidden_states[model.config.vision_feature_layer]  # [B*F, T, D]
    proj = model.model.multi_modal_projector(feats)  # [B*F, T, H]
    embeds = model.get_input_embeddings()(ids)  # [B, L, H]
    where = (ids == target.video_token_id).unsqueeze(-1).expand_as(embeds)
    embeds = embeds.masked_scatter(where, proj.reshape(-1, proj.shape[-1]).to(embeds.dtype))
    out = model(inputs_embeds=embeds, attention_mask=mask, labels=labels)
    return out.loss, feats.view(b, f, *feats.shape[1:])


def train_target(args: ModelTraining, out: Path) -> dict[str, object]:
    """Train the toy target into ``out``; returns the metrics written to its model card."""
    seed_everything(args.seed)
    device = torch.device(args.device)
    t_start = time.perf_counter()
    train_seeds = list(range(args.first_seed, args.first_seed + args.scenes))
    log.info("rendering %d training scenes ...", len(train_seeds))
    frames = torch.from_numpy(frames_for(train_seeds, args.workers)).to(device)
    examples = examples_for(train_seeds)
    log.info("%d examples from %d scenes (%.1f s)", len(examples), len(train_seeds),
             time.perf_counter() - t_start)
    target = build_untrained_toy_target(args.seed, args.device)
    model: Any = target.model  # transformers' decorators hide these methods from mypy
    encoded = encode_examples(target, examples)
    pad = int(model.config.text_config.pad_token_id)
    scene_labels = [attribute_labels(sample_scene(s)) for s in train_seeds]
    label_t = {h: torch.tensor([lab[h] for lab in scene_labels], device=device) for h in HEADS}
    aux = AuxHeads(NUM_FRAMES, model.config.vision_config.hidden_size, list(HEADS)).to(device)
    model.train()
    params = list(model.parameters()) + list(aux.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    rng = random.Random(args.seed)
    amp = device.type == "cuda"
    progress = TrainProgress("target", args.steps, args.log_every, log)
    for step in range(args.steps):
        ids, mask, labels, scene_idx = batch_tensors(rng.sample(encoded, args.batch), pad, device)
        pix = normalise(frames[scene_idx])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            lm_loss, feats = forward_with_features(target, ids, mask, labels, pix)
            aux_loss = aux(feats, {h: t[scene_idx] for h, t in label_t.items()})
            loss = lm_loss + args.aux_weight * aux_loss
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        optimise(opt, loss, params, lr)
        progress.record(step, lm_loss.item(), aux_loss.item(), lr)
    model.eval()
    train_s = progress.seconds
    val = evaluate_target(target, range(args.val_seed, args.val_seed + args.val_scenes),
                          args.workers)
    log.info("target validation accuracy: %s", json.dumps(val))
    metrics: dict[str, object] = {
        "train_scenes": len(train_seeds), "train_examples": len(examples), "steps": args.steps,
        "batch": args.batch, "final_loss": progress.final_loss,
        "train_seconds": round(train_s, 1), "device": device_name(device),
        "validation": val,
    }
    model.half()
    save_target(target, out)
    write_card(out, TOY_MODEL_ID, TARGET_CARD, metrics)
    return metrics


@torch.no_grad()
def greedy_answer_ids(target: TargetModel, frames_u8: torch.Tensor, questions: Sequence[str],
                      max_new: int = 12) -> list[list[int]]:
    """Batched greedy answers (left-padded ``generate``) for [B, 8, H, W, 3] frames, as
    token ids cut after EOS (EOS kept)."""
    model: Any = target.model
    device = next(model.parameters()).device
    prompts = [target.build_prompt_ids(q) for q in questions]
    width = max(len(p) for p in prompts)
    pad = int(model.config.text_config.pad_token_id)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    pix = normalise(frames_u8.to(device)).to(next(model.parameters()).dtype)
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                         pixel_values_videos=pix, max_new_tokens=max_new, do_sample=False,
                         eos_token_id=target.eos_token_id, pad_token_id=pad,
                         suppress_tokens=list(range(target.text_vocab_size,
                                                    target.vocab_size)))
    answers = []
    for row in out[:, width:].tolist():
        cut = row.index(target.eos_token_id) + 1 if target.eos_token_id in row else len(row)
        answers.append(row[:cut])
    return answers


def greedy_answers(target: TargetModel, frames_u8: torch.Tensor, questions: Sequence[str],
                   max_new: int = 12) -> list[str]:
    """:func:`greedy_answer_ids`, decoded."""
    return [str(target.tokenizer.decode(ids, skip_special_tokens=True))
            for ids in greedy_answer_ids(target, frames_u8, questions, max_new)]


def evaluate_target(target: TargetModel, seeds: Sequence[int],
                    workers: int) -> dict[str, float]:
    """Accuracy by question type on the frames path (structured answers, not strings)."""
    frames = torch.from_numpy(frames_for(list(seeds), workers))
    return accuracy_by_type(examples_for(list(seeds)), frames,
                            lambda f, qs: greedy_answers(target, f, qs))


@torch.no_grad()
def video_features(target: TargetModel, seeds: Sequence[int], workers: int) -> torch.Tensor:
    """Pre-projector video features of scenes, the adapter's targets. [N, 8, T, D] float32."""
    frames = torch.from_numpy(frames_for(list(seeds), workers))
    feats = []
    for start in range(0, len(seeds), 128):
        pix = normalise(frames[start : start + 128].to(target.device))  # [b, 8, 3, H, W]
        for one in pix:
            # Rounded through float16 as the shipped adapter's training data was.
            feats.append(target.video_features_from_pixels(one.unsqueeze(0)).half().float().cpu())
    return torch.stack(feats)


TARGET_CARD = """The embedded default target of eventspec: `VideoLlavaForConditionalGeneration` at
toy size (3-layer CLIP at 64 px with 16 px patches, 8 frames x 17 tokens; 3-layer LLaMA,
hidden 192), trained from scratch on RGB clips of `eventspec.demoworld` scenes to answer
templated questions about direction, shape, colour, count and motion. Weights are stored
in float16."""
