"""Training the toy feature adapter: the draft's CLIP features onto the target's.

The adapter maps the toy EventGPT's CLIP features onto the toy Video-LLaVA's
pre-projector video features, so an event-only edge can feed the target. It is
trained on paired scenes: the same seeds rendered as events for the draft and as RGB
clips for the target, whose features are computed here from the target model (the
demo world may load both nodes' models; the nodes never load each other's).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from eventspec.cloud.target import TargetModel, load_target
from eventspec.demoworld.train.common import (
    device_name,
    lr_at,
    normalise,
    seed_everything,
    write_card,
)
from eventspec.demoworld.train.draft import event_frames_for
from eventspec.demoworld.train.settings import AdapterTraining
from eventspec.demoworld.train.target import video_features
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.vision.align import (
    FeatureAdapter,
    build_adapter_for,
    load_adapter,
    save_adapter,
)

log = logging.getLogger("eventspec.toy.adapter")

TOY_ADAPTER_ID = "toy-adapter"
#: Per-token cosine thresholds reported as "accept" shares.
THRESHOLDS = (0.8, 0.85, 0.9)


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


def paired_features(
    target_dir: Path, draft_dir: Path, seeds: Sequence[int], device: str, workers: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft CLIP features [N, 5, T_s, D_s], target video features [N, 8, T_t, D_t])."""
    target: TargetModel = load_target(target_dir, device=device, dtype=torch.float32)
    tgt = video_features(target, seeds, workers)
    del target
    draft = load_draft(draft_dir, device=device, dtype=torch.float32)
    return draft_clip_features(draft, seeds, workers), tgt


def train_adapter(
    args: AdapterTraining, target_dir: Path, draft_dir: Path, out: Path
) -> dict[str, object]:
    """Train the adapter between the models in ``target_dir`` and ``draft_dir`` into ``out``."""
    seed_everything(args.seed)
    device = torch.device(args.device)
    seeds = list(range(args.scenes))
    src, target_feats = paired_features(target_dir, draft_dir, seeds, args.device, args.workers)
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
    save_adapter(adapter.cpu(), out)
    write_card(out, TOY_ADAPTER_ID, ADAPTER_CARD, metrics)
    return metrics


def cosine_metrics(pred: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Mean per-token cosine, and the share of tokens at or above each threshold."""
    cos = torch.nn.functional.cosine_similarity(pred.float(), target.float(), dim=-1).flatten()
    out = {"cos_mean": round(float(cos.mean()), 4)}
    for t in THRESHOLDS:
        out[f"accept_at_{str(t).replace('.', '_')}"] = round(float((cos >= t).float().mean()), 4)
    return out


@torch.no_grad()
def adapter_metrics(target_dir: Path, draft_dir: Path, adapter_dir: Path,
                    seeds: Sequence[int], workers: int) -> dict[str, float]:
    """Adapter agreement with the target's own features on ``seeds`` (CPU)."""
    src, tgt = paired_features(target_dir, draft_dir, seeds, "cpu", workers)
    adapter: FeatureAdapter = load_adapter(adapter_dir)
    return cosine_metrics(adapter(src), tgt)


ADAPTER_CARD = """Maps the toy EventGPT's CLIP features [5, 65, 128] onto the toy
Video-LLaVA's pre-projector video features [8, 17, 128]: CLS/grid resampling, time
interpolation, a channel map, then 2 self-attention layers over the 136 output tokens.
Trained on paired scenes with a cosine + scaled-MSE loss. Metrics are per-token cosine on
held-out scenes."""
