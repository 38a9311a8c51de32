"""The misaligned toy drafter: the aligned toy draft retrained on other wording.

Why: a drafter whose raw acceptance against the toy target is low (0.05-0.3, issue 22)
is what the token adapter and the draft head must be judged on; the aligned pair's
~0.93 leaves nothing to gain. The real EventGPT and Video-LLaVA see the same world but
were tuned on different text, so the misaligned drafter starts from the aligned one
(same vision path, same knowledge of the scenes) and is fine-tuned on
:func:`eventspec.demoworld.drafter_wording.drafter_answer`. CLIP stays frozen (its
features are computed once), so this runs in minutes on a CPU. Run it through
``eventspec toy train --stages misaligned``.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import torch

from eventspec.demoworld.drafter_wording import drafter_answer
from eventspec.demoworld.train.adapter import draft_clip_features
from eventspec.demoworld.train.common import (
    TrainProgress,
    device_name,
    examples_for,
    lr_at,
    optimise,
    seed_everything,
    write_card,
)
from eventspec.demoworld.train.draft import _batch_embeds, _split_prompts, evaluate_draft
from eventspec.demoworld.train.settings import ModelTraining
from eventspec.edge.drafting.checkpoint import load_draft, save_draft
from eventspec.edge.drafting.eventgpt import DraftModel

log = logging.getLogger("eventspec.toy.misaligned")

TOY_MISALIGNED_ID = "toy-eventgpt-misaligned"


def train_misaligned(args: ModelTraining, aligned_dir: Path, out: Path) -> dict[str, object]:
    """Fine-tune the draft in ``aligned_dir`` on the drafter's wording into ``out``.

    Returns the metrics written to its model card.
    """
    seed_everything(args.seed)
    device = torch.device(args.device)
    draft: DraftModel = load_draft(aligned_dir, device=device, dtype=torch.float32)
    model: Any = draft.model  # transformers' decorators hide eval/half from mypy
    seeds = list(range(args.first_seed, args.first_seed + args.scenes))
    clip = draft_clip_features(draft, seeds, args.workers)  # [N, 5, T, Dv], CLIP frozen
    examples = examples_for(seeds)
    prefix, suffixes = _split_prompts(draft, [qa.question for _, qa in examples])
    tok = draft.tokenizer
    encoded = []
    for (i, qa), suffix in zip(examples, suffixes, strict=True):
        text = drafter_answer(qa.qtype, qa.value)
        answer = [*tok(text, add_special_tokens=False).input_ids, draft.eos_token_id]
        encoded.append((i, suffix, answer))
    params = [p for n, p in model.named_parameters() if "visual_tower" not in n]
    for n, p in model.named_parameters():
        p.requires_grad_("visual_tower" not in n)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    prefix_t = torch.tensor(prefix, device=device)
    rng = random.Random(args.seed)
    progress = TrainProgress("misaligned", args.steps, args.log_every, log)
    model.train()
    for step in range(args.steps):
        batch = rng.sample(encoded, min(args.batch, len(encoded)))
        feats = clip[[i for i, _, _ in batch]].to(device)  # [B, 5, T, Dv]
        x, mask, labels = _batch_embeds(model, prefix_t, feats,
                                        [sfx + ans for _, sfx, ans in batch],
                                        [len(ans) for _, _, ans in batch])
        loss = model(inputs_embeds=x, attention_mask=mask, labels=labels).loss
        lr = lr_at(step, args.steps, args.lr, args.warmup)
        optimise(opt, loss, params, lr)
        progress.record(step, loss.item(), 0.0, lr)
    model.eval()
    draft.model_id = TOY_MISALIGNED_ID
    val = evaluate_draft(draft, range(args.val_seed, args.val_seed + args.val_scenes),
                         args.workers)
    log.info("misaligned draft validation accuracy: %s", json.dumps(val))
    metrics: dict[str, object] = {
        "initialised_from": aligned_dir.name, "train_scenes": len(seeds),
        "train_examples": len(examples), "steps": args.steps, "batch": args.batch,
        "lr": args.lr, "final_loss": progress.final_loss,
        "train_seconds": round(progress.seconds, 1), "device": device_name(device),
        "validation": val,
    }
    model.half()
    save_draft(draft, out, layout="5.x", include_clip=True)
    write_card(out, TOY_MISALIGNED_ID, MISALIGNED_CARD, metrics)
    return metrics


MISALIGNED_CARD = """The misaligned toy drafter (issue 22): the aligned toy draft (`toy-eventgpt`,
same architecture and vision path) fine-tuned with CLIP frozen on other wording with an
event-only emphasis (`eventspec.demoworld.drafter_wording`): "Motion goes left. Event
camera only." where the target says "It is moving left.", "I see two things. Event
camera only." for "There are two objects.", "Events show no colour. Event camera only."
for any colour. It states the same facts as the aligned draft
but its tokens rarely match the target's, as EventGPT's rarely match Video-LLaVA's:
the drafter the token adapter and the draft head are judged on. Weights in float16.
Select it with `eventspec-edge serve --model toy-misaligned`; rebuild it with
`eventspec toy train --stages misaligned --out DIR` (CPU: a few minutes)."""
