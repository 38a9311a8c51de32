"""The toy world's edge models: a small EventGPT and the feature adapter.

The draft is the project's EventGPT class at toy size, trained on the event frames of
``shared.toyworld`` scenes (the clip's last 50 ms, rendered exactly as the running
edge renders them) to answer the same templated questions as the cloud's toy target.
Events carry motion and edges but no colour, so colour answers are near chance: those
are the drafts the cloud corrects.

The adapter maps the draft's CLIP features onto the target's pre-projector video
features; it is trained on paired scenes, with the target features exported by
``python -m cloud.toy export-features`` (the nodes never import each other).

    python -m edge.toy train-draft --out edge/models/toy-eventgpt --scenes 12000 --steps 3000
    python -m edge.toy train-adapter --draft DIR --features feats.safetensors --out DIR
    python -m edge.toy adapter-metrics --features heldout.safetensors --json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import CLIPVisionConfig, PreTrainedTokenizerFast

from edge.align import FeatureAdapter, build_adapter_for, load_adapter, save_adapter
from edge.draft import (
    EVENT_TOKEN_INDEX,
    DraftModel,
    EventGPTConfig,
    EventGPTForCausalLM,
)
from edge.draft_checkpoint import load_draft, save_draft
from edge.events.render import events_to_frames, set_draft_canvas
from shared.toyworld.corpus import TOY_TEXT_VOCAB_SIZE, build_toy_tokenizer
from shared.toyworld.events import events_in_window, simulate_events
from shared.toyworld.labels import attribute_labels
from shared.toyworld.scenes import sample_scene
from shared.toyworld.training import (
    AuxHeads,
    TrainProgress,
    accuracy_by_type,
    device_name,
    examples_for,
    lr_at,
    normalise,
    optimise,
    seed_everything,
)

log = logging.getLogger("eventspec.toy.edge")

MODELS_DIR = Path(__file__).resolve().parent / "models"
TOY_DRAFT_DIR = MODELS_DIR / "toy-eventgpt"
TOY_ADAPTER_DIR = MODELS_DIR / "toy-adapter"
TOY_DRAFT_ID = "toy-eventgpt"
IMAGE_SIZE, PATCH = 64, 8
EVENT_WINDOW_US = 50_000
THRESHOLDS = (0.8, 0.85, 0.9)


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
        bos_token_id=1, eos_token_id=2, mm_visual_tower=None, event_feature_adaptor=True,
        vision_config=vision.to_dict(), image_size=IMAGE_SIZE,
    )


def toy_draft_tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=build_toy_tokenizer("draft"), bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", pad_token="<unk>", clean_up_tokenization_spaces=False,
    )


def load_toy_draft(device: str = "cpu", dtype: torch.dtype = torch.float32) -> DraftModel:
    """The committed toy draft (``--model toy``)."""
    draft = load_draft(TOY_DRAFT_DIR, device=device, dtype=dtype)
    draft.model_id = TOY_DRAFT_ID
    set_draft_canvas(draft, "sensor")  # trained on full-sensor canvases
    return draft


def load_toy_adapter() -> FeatureAdapter:
    return load_adapter(TOY_ADAPTER_DIR)


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



def train_draft(args: argparse.Namespace) -> dict[str, object]:
    seed_everything(args.seed)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    seeds = list(range(args.first_seed, args.first_seed + args.scenes))
    log.info("simulating events for %d training scenes ...", len(seeds))
    frames = torch.from_numpy(event_frames_for(seeds, args.workers)).to(device)
    examples = examples_for(seeds)
    log.info("%d examples (%.1f s)", len(examples), time.perf_counter() - t0)
    tokenizer = toy_draft_tokenizer()
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
    save_draft(draft, args.out, layout="5.x", include_clip=True)
    write_card(Path(args.out), "toy-eventgpt", DRAFT_CARD, metrics)
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


@torch.no_grad()
def draft_clip_features(draft: DraftModel, seeds: Sequence[int], workers: int) -> torch.Tensor:
    """The adapter's inputs: the draft's CLIP features of each scene. [N, 5, T, Dv]."""
    frames = torch.from_numpy(event_frames_for(list(seeds), workers))
    out = []
    for start in range(0, len(seeds), 128):
        pix = normalise(frames[start : start + 128].to(draft.device)).to(draft.dtype)
        clip = draft.model.clip_features(pix.flatten(0, 1))
        out.append(clip.view(pix.shape[0], 5, *clip.shape[1:]).float())
    return torch.cat(out)


def _load_features(path: Path) -> tuple[torch.Tensor, list[int]]:
    from safetensors.torch import load_file

    data = load_file(str(path))
    return data["features"].float(), [int(s) for s in data["seeds"].tolist()]


def train_adapter(args: argparse.Namespace) -> dict[str, object]:
    seed_everything(args.seed)
    device = torch.device(args.device)
    draft = load_draft(args.draft, device=args.device, dtype=torch.float32)
    target_feats, seeds = _load_features(args.features)  # [N, 8, T_t, D_t]
    src = draft_clip_features(draft, seeds, args.workers)  # [N, 5, T_s, D_s]
    s_f, s_t, s_d = (int(d) for d in src.shape[1:])
    t_f, t_t, t_d = (int(d) for d in target_feats.shape[1:])
    adapter = build_adapter_for((s_f, s_t, s_d), (t_f, t_t, t_d), seed=args.seed,
                                hidden=args.hidden, mixer_layers=args.mixer_layers).to(device)
    src, tgt = src.to(device), target_feats.to(device)
    scale = tgt.pow(2).mean().sqrt()
    n_val = min(max(64, len(seeds) // 20), len(seeds) // 2)
    opt = torch.optim.AdamW(adapter.parameters(), lr=args.lr, weight_decay=0.01)
    rng = torch.Generator(device="cpu").manual_seed(args.seed)
    t0 = time.perf_counter()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, 100)
        idx = torch.randint(n_val, len(seeds), (args.batch,), generator=rng)
        pred = adapter(src[idx])
        cos = torch.nn.functional.cosine_similarity(pred, tgt[idx], dim=-1)
        loss = (1 - cos).mean() + ((pred - tgt[idx]) / scale).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            log.info("adapter step %d/%d loss %.4f cos %.3f (%.0f s)", step + 1, args.steps,
                     float(loss), float(cos.mean()), time.perf_counter() - t0)
    adapter.eval()
    with torch.no_grad():
        held = cosine_metrics(adapter(src[:n_val]), tgt[:n_val])
    log.info("adapter on %d held-out training-range scenes: %s", n_val, json.dumps(held))
    metrics: dict[str, object] = {"scenes": len(seeds), "steps": args.steps,
                                  "train_seconds": round(time.perf_counter() - t0, 1),
                                  "held_out": held, "device": device_name(device)}
    save_adapter(adapter.cpu(), args.out)
    write_card(Path(args.out), "toy-adapter", ADAPTER_CARD, metrics)
    return metrics


def cosine_metrics(pred: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Mean per-token cosine, and the share of tokens at or above each threshold."""
    cos = torch.nn.functional.cosine_similarity(pred.float(), target.float(), dim=-1).flatten()
    out = {"cos_mean": round(float(cos.mean()), 4)}
    for t in THRESHOLDS:
        out[f"accept_at_{str(t).replace('.', '_')}"] = round(float((cos >= t).float().mean()), 4)
    return out


@torch.no_grad()
def adapter_metrics(features: Path, draft_dir: Path, adapter_dir: Path,
                    workers: int) -> dict[str, float]:
    """Adapter agreement on scenes whose target features were exported by the cloud."""
    draft = load_draft(draft_dir, device="cpu", dtype=torch.float32)
    adapter = load_adapter(adapter_dir)
    target_feats, seeds = _load_features(features)
    src = draft_clip_features(draft, seeds, workers)
    return cosine_metrics(adapter(src), target_feats)


DRAFT_CARD = """The embedded default draft of eventspec: the project's EventGPT class
(`LlamaForCausalLM` + `CLIPVisionModel` + projector + feature adaptor) at toy size (3-layer
CLIP at 64 px with 8 px patches, 70 pooled event tokens; 3-layer LLaMA, hidden 192),
trained from scratch on the last 50 ms of events of `shared.toyworld` scenes, rendered as
EventGPT's 5 equal-count polarity frames. It cannot see colour. Weights in float16."""

ADAPTER_CARD = """Maps the toy EventGPT's CLIP features [5, 65, 128] onto the toy
Video-LLaVA's pre-projector video features [8, 17, 128]: CLS/grid resampling, time
interpolation, a channel map, then 2 self-attention layers over the 136 output tokens.
Trained on paired scenes with a cosine + scaled-MSE loss. Metrics are per-token cosine on
held-out scenes."""


def write_card(out: Path, name: str, text: str, metrics: dict[str, object]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(
        f"# {name}\n\n{text}\n\nTrained by `eventspec toy train`.\n\n```json\n"
        f"{json.dumps(metrics, indent=2)}\n```\n"
    )
    (out / "training.json").write_text(json.dumps(metrics, indent=2))



def main(argv: list[str] | None = None) -> int:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    workers = max(1, (os.cpu_count() or 2) - 1)
    parser = argparse.ArgumentParser(prog="python -m edge.toy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    td = sub.add_parser("train-draft")
    td.add_argument("--out", type=Path, default=TOY_DRAFT_DIR)
    td.add_argument("--scenes", type=int, default=12000)
    td.add_argument("--first-seed", type=int, default=0)
    td.add_argument("--steps", type=int, default=3000)
    td.add_argument("--batch", type=int, default=64)
    td.add_argument("--lr", type=float, default=1e-3)
    td.add_argument("--warmup", type=int, default=200)
    td.add_argument("--aux-weight", type=float, default=0.5)
    td.add_argument("--seed", type=int, default=0)
    td.add_argument("--val-seed", type=int, default=1_000_000)
    td.add_argument("--val-scenes", type=int, default=256)
    td.add_argument("--device", default=default_device)
    td.add_argument("--workers", type=int, default=workers)
    td.add_argument("--log-every", type=int, default=100)
    ta = sub.add_parser("train-adapter")
    ta.add_argument("--draft", type=Path, default=TOY_DRAFT_DIR)
    ta.add_argument("--features", type=Path, required=True)
    ta.add_argument("--out", type=Path, default=TOY_ADAPTER_DIR)
    ta.add_argument("--steps", type=int, default=6000)
    ta.add_argument("--batch", type=int, default=128)
    ta.add_argument("--hidden", type=int, default=256)
    ta.add_argument("--mixer-layers", type=int, default=2,
                    help="self-attention layers over the output tokens (0: none)")
    ta.add_argument("--lr", type=float, default=2e-3)
    ta.add_argument("--seed", type=int, default=0)
    ta.add_argument("--device", default=default_device)
    ta.add_argument("--workers", type=int, default=workers)
    ta.add_argument("--log-every", type=int, default=200)
    am = sub.add_parser("adapter-metrics")
    am.add_argument("--features", type=Path, required=True)
    am.add_argument("--draft", type=Path, default=TOY_DRAFT_DIR)
    am.add_argument("--adapter", type=Path, default=TOY_ADAPTER_DIR)
    am.add_argument("--workers", type=int, default=workers)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.command == "train-draft":
        print(json.dumps(train_draft(args)))
    elif args.command == "train-adapter":
        print(json.dumps(train_adapter(args)))
    else:
        print(json.dumps(adapter_metrics(args.features, args.draft, args.adapter, args.workers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
