"""Training the toy draft: a small EventGPT that answers from events alone.

The draft is the project's EventGPT class at toy size, trained on the event frames of
toy scenes (the clip's last 50 ms, rendered exactly as the running edge renders them)
to answer the same templated questions as the toy target. Events carry motion and
edges but no colour, so colour answers are near chance: those are the drafts the cloud
corrects. Run it through ``eventspec toy train``.
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
from transformers import CLIPVisionConfig

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
from eventspec.edge.drafting.checkpoint import save_draft
from eventspec.edge.drafting.eventgpt import (
    EVENT_TOKEN_INDEX,
    DraftModel,
    EventGPTConfig,
    EventGPTForCausalLM,
)
from eventspec.edge.events.render import events_to_frames
from eventspec.shared.toyworld.events import events_in_window, simulate_events
from eventspec.shared.toyworld.labels import attribute_labels
from eventspec.shared.toyworld.scenes import sample_scene

log = logging.getLogger("eventspec.toy.draft")

TOY_DRAFT_ID = "toy-eventgpt"
IMAGE_SIZE, PATCH = 64, 8
EVENT_WINDOW_US = 50_000


def toy_draft_config(text_vocab_size: int = TOY_TEXT_VOCAB_SIZE) -> EventGPTConfig:
    """EventGPT at toy size: a 3-layer CLIP at 64 px with 8 px patches (65 tokens per
    frame, 70 event tokens after pooling) and a 3-layer LLaMA."""
    vision = CLIPVisionConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                              num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH,
                              projection_dim=128)
    return EventGPTConfig(
        vocab_size=(text_vocab_size + 1 + 63) // 64 * 64, hidden_size=192,
        intermediate_size=512, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=6, max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, mm_visual_tower=None, event_feature_adaptor=True,
        vision_config=vision.to_dict(), image_size=IMAGE_SIZE,
        # Trained on full-sensor canvases, not EventGPT's per-frame ones
        # (eventspec.edge.events.render).
        event_canvas="sensor",
    )


# -- data -----------------------------------------------------------------------------------


def scene_event_frames(seed: int) -> np.ndarray:
    """EventGPT's 5 frames of the clip's last 50 ms, as the edge renders them. [5,H,W,3]."""
    scene = sample_scene(seed)
    events = simulate_events(scene)
    end = scene.duration_us
    window = events_in_window(events, end - EVENT_WINDOW_US, end)
    return np.stack(events_to_frames(window, (scene.width, scene.height), 5, canvas="sensor"))


def event_frames_for(seeds: Sequence[int], workers: int) -> np.ndarray:
    if workers <= 1:
        return np.stack([scene_event_frames(s) for s in seeds])
    with ProcessPoolExecutor(workers) as pool:
        return np.stack(list(pool.map(scene_event_frames, seeds, chunksize=32)))


def _embeds(model: EventGPTForCausalLM, clip: torch.Tensor,
            rows: Sequence[list[int]]) -> list[torch.Tensor]:
    """Per row: prompt (with one -200) spliced with that scene's event tokens. [L', H]."""
    out = []
    for feats, ids in zip(clip, rows, strict=True):
        events = model.event_tokens(feats)  # [5 + T, H]
        out.append(model.embed_with_events(ids, events)[0])
    return out


# -- training -------------------------------------------------------------------------------

#: Events carry motion, edges and count, not colour: no colour head for the draft.
DRAFT_HEADS = ("direction", "shape", "count")


def _split_prompts(
    draft: DraftModel, questions: Sequence[str]
) -> tuple[list[int], list[list[int]]]:
    """The shared prompt prefix before the event placeholder, and each question's suffix."""
    cache: dict[str, list[int]] = {}
    prefix: list[int] | None = None
    suffixes = []
    for q in questions:
        if q not in cache:
            ids = draft.build_prompt_ids(q)
            cut = ids.index(EVENT_TOKEN_INDEX)
            if prefix is None:
                prefix = ids[:cut]
            if ids[:cut] != prefix:
                raise ValueError("prompts differ before the event placeholder")
            cache[q] = ids[cut + 1 :]
        suffixes.append(cache[q])
    assert prefix is not None
    return prefix, suffixes


def _batch_embeds(
    model: EventGPTForCausalLM, prefix: torch.Tensor, clip: torch.Tensor,
    suffixes: Sequence[list[int]], answer_lens: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[prefix | event tokens | suffix + answer], right-padded, as EventGPT splices them.

    clip [B, 5, T, Dv]. Returns inputs_embeds [B, L, H], attention mask and labels
    (-100 except on the answer). Same math as ``EventGPTForCausalLM.event_tokens``.
    """
    m = model.event_model
    b = clip.shape[0]
    feats = m.feature_adaptor(m.visual_projector(clip))  # [B, 5, T, H]
    events = torch.cat([feats.mean(dim=2), feats.mean(dim=1)], dim=1)  # [B, 5 + T, H]
    embed = model.get_input_embeddings()
    width = max(len(x) for x in suffixes)
    ids = torch.zeros(b, width, dtype=torch.long, device=clip.device)
    tail_mask = torch.zeros(b, width, dtype=torch.long, device=clip.device)
    tail_labels = torch.full((b, width), -100, dtype=torch.long, device=clip.device)
    for j, (sfx, n_ans) in enumerate(zip(suffixes, answer_lens, strict=True)):
        ids[j, : len(sfx)] = torch.tensor(sfx)
        tail_mask[j, : len(sfx)] = 1
        tail_labels[j, len(sfx) - n_ans : len(sfx)] = torch.tensor(sfx[len(sfx) - n_ans :])
    head = embed(prefix).unsqueeze(0).expand(b, -1, -1)  # [B, P, H]
    x = torch.cat([head, events.to(head.dtype), embed(ids)], dim=1)
    n_fixed = head.shape[1] + events.shape[1]
    mask = torch.cat([torch.ones(b, n_fixed, dtype=torch.long, device=clip.device), tail_mask], 1)
    labels = torch.cat([torch.full((b, n_fixed), -100, dtype=torch.long, device=clip.device),
                        tail_labels], dim=1)
    return x, mask, labels


def train_draft(args: ModelTraining, out: Path) -> dict[str, object]:
    """Train the toy draft into ``out``; returns the metrics written to its model card."""
    seed_everything(args.seed)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    seeds = list(range(args.first_seed, args.first_seed + args.scenes))
    log.info("simulating events for %d training scenes ...", len(seeds))
    frames = torch.from_numpy(event_frames_for(seeds, args.workers)).to(device)
    examples = examples_for(seeds)
    log.info("%d examples (%.1f s)", len(examples), time.perf_counter() - t0)
    tokenizer = toy_fast_tokenizer("draft")
    model = EventGPTForCausalLM(toy_draft_config()).to(device)  # type: ignore[arg-type]
    draft = DraftModel(model, tokenizer, TOY_DRAFT_ID)
    prefix, suffixes = _split_prompts(draft, [qa.question for _, qa in examples])
    encoded = []
    for (i, qa), suffix in zip(examples, suffixes, strict=True):
        answer = [*tokenizer(qa.answer, add_special_tokens=False).input_ids, draft.eos_token_id]
        encoded.append((i, suffix, answer))
    scene_labels = [attribute_labels(sample_scene(s)) for s in seeds]
    label_t = {h: torch.tensor([lab[h] for lab in scene_labels], device=device)
               for h in DRAFT_HEADS}
    aux = AuxHeads(5, draft.clip_config.hidden_size, DRAFT_HEADS).to(device)
    prefix_t = torch.tensor(prefix, device=device)
    model.train()
    params = list(model.parameters()) + list(aux.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    rng = random.Random(args.seed)
    amp = device.type == "cuda"
    progress = TrainProgress("draft", args.steps, args.log_every, log)
    for step in range(args.steps):
        batch = rng.sample(encoded, args.batch)
        idx = [i for i, _, _ in batch]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            clip = model.clip_features(normalise(frames[idx]).flatten(0, 1))  # [B*5, T, Dv]
            clip = clip.view(len(batch), 5, *clip.shape[1:])
            x, mask, labels = _batch_embeds(model, prefix_t, clip,
                                            [sfx + ans for _, sfx, ans in batch],
                                            [len(ans) for _, _, ans in batch])
            lm_loss = model(inputs_embeds=x, attention_mask=mask, labels=labels).loss
            aux_loss = aux(clip, {h: t[idx] for h, t in label_t.items()})
            loss = lm_loss + args.aux_weight * aux_loss
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        optimise(opt, loss, params, lr)
        progress.record(step, lm_loss.item(), aux_loss.item(), lr)
    model.eval()
    train_s = progress.seconds
    val = evaluate_draft(draft, range(args.val_seed, args.val_seed + args.val_scenes),
                         args.workers)
    log.info("draft validation accuracy: %s", json.dumps(val))
    metrics: dict[str, object] = {
        "train_scenes": len(seeds), "train_examples": len(examples), "steps": args.steps,
        "batch": args.batch, "final_loss": progress.final_loss,
        "train_seconds": round(train_s, 1), "device": device_name(device),
        "validation": val,
    }
    model.half()
    save_draft(draft, out, layout="5.x", include_clip=True)
    write_card(out, TOY_DRAFT_ID, DRAFT_CARD, metrics)
    return metrics


@torch.no_grad()
def greedy_answers(draft: DraftModel, frames_u8: torch.Tensor, questions: Sequence[str],
                   max_new: int = 12) -> list[str]:
    """Batched greedy answers from event frames [B, 5, H, W, 3] (left-padded embeds)."""
    model: Any = draft.model  # transformers' decorators hide generate's type from mypy
    device = draft.device
    pix = normalise(frames_u8.to(device)).to(draft.dtype)
    clip = model.clip_features(pix.flatten(0, 1)).view(len(questions), 5, -1,
                                                       draft.clip_config.hidden_size)
    embeds = _embeds(model, clip, [draft.build_prompt_ids(q) for q in questions])
    width = max(e.shape[0] for e in embeds)
    x = torch.zeros(len(embeds), width, embeds[0].shape[1], device=device, dtype=draft.dtype)
    mask = torch.zeros(len(embeds), width, dtype=torch.long, device=device)
    for j, e in enumerate(embeds):
        x[j, width - e.shape[0]:] = e
        mask[j, width - e.shape[0]:] = 1
    out = model.generate(inputs_embeds=x, attention_mask=mask, max_new_tokens=max_new,
                         do_sample=False, eos_token_id=draft.eos_token_id,
                         pad_token_id=draft.eos_token_id,
                         suppress_tokens=list(range(draft.text_vocab_size,
                                                    model.config.vocab_size)))
    return [str(draft.tokenizer.decode(row, skip_special_tokens=True)) for row in out.tolist()]


def evaluate_draft(draft: DraftModel, seeds: Sequence[int], workers: int) -> dict[str, float]:
    """Accuracy by question type from events alone (structured answers)."""
    frames = torch.from_numpy(event_frames_for(list(seeds), workers))
    return accuracy_by_type(examples_for(list(seeds)), frames,
                            lambda f, qs: greedy_answers(draft, f, qs))


DRAFT_CARD = """The embedded default draft of eventspec: the project's EventGPT class
(`LlamaForCausalLM` + `CLIPVisionModel` + projector + feature adaptor) at toy size (3-layer
CLIP at 64 px with 8 px patches, 70 pooled event tokens; 3-layer LLaMA, hidden 192),
trained from scratch on the last 50 ms of events of `eventspec.demoworld` scenes, rendered as
EventGPT's 5 equal-count polarity frames. It cannot see colour. Weights in float16."""
