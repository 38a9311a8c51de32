"""``eventspec-edge train-adapter``: a token adapter or draft head from a commit log.

Offline, on whatever the edge has (CPU is enough at toy size): the log's requests
(``eventspec.edge.learning.commit_log``) are split into training and held-out ones, the network
learns the committed token at each position by cross-entropy (distillation from the
target's greedy outputs, as DistillSpec's on-policy data: Zhou et al. 2024), and the
result is a model directory with a card saying what it was trained on and how often
its argmax matched the cloud's commit on the held-out requests.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from eventspec.edge.learning.commit_log import LogMeta, Request, read_log
from eventspec.edge.learning.token_heads import (
    TokenHead,
    TokenHeadConfig,
    build_head,
    macs_per_token,
    save_head,
)
from eventspec.edge.learning.train_settings import HeadTraining
from eventspec.shared.contract.errors import InvalidInput

log = logging.getLogger(__name__)


def padded(requests: list[Request], start_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded batch: features [B, n, H], fed tokens [B, n], labels [B, n] (-100 on
    padding), mask [B, n]. The fed token at row 0 is ``start_id`` (answer start)."""
    n = max(len(r.tokens) for r in requests)
    dim = requests[0].features.shape[1]
    feats = torch.zeros(len(requests), n, dim)
    fed = torch.full((len(requests), n), start_id, dtype=torch.long)
    labels = torch.full((len(requests), n), -100, dtype=torch.long)
    mask = torch.zeros(len(requests), n, dtype=torch.long)
    for i, r in enumerate(requests):
        k = len(r.tokens)
        toks = torch.from_numpy(r.tokens.astype(np.int64))
        feats[i, :k] = torch.from_numpy(r.features.astype(np.float32))
        fed[i, 1:k] = toks[: k - 1]
        labels[i, :k] = toks
        mask[i, :k] = 1
    return feats, fed, labels, mask


@torch.no_grad()
def top1_match(head: TokenHead, requests: list[Request], start_id: int) -> float:
    """Share of positions where the head's argmax is the committed token."""
    if not requests:
        return 0.0
    right = total = 0
    for i in range(0, len(requests), 256):
        feats, fed, labels, mask = padded(requests[i : i + 256], start_id)
        pred = head(feats, fed, mask).argmax(-1)  # [B, n]
        keep = labels != -100
        right += int((pred[keep] == labels[keep]).sum())
        total += int(keep.sum())
    return right / max(total, 1)


def train_head(meta: LogMeta, requests: list[Request],
               args: HeadTraining) -> tuple[TokenHead, dict[str, object]]:
    """Train on all but the last ``holdout`` share of ``requests`` (in a seeded order)."""
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    order = list(range(len(requests)))
    rng.shuffle(order)
    n_held = int(len(order) * args.holdout)
    held = [requests[i] for i in order[:n_held]]
    train = [requests[i] for i in order[n_held:]]
    if not train:
        raise InvalidInput("no requests left to train on; lower --holdout or log more")
    config = TokenHeadConfig(kind=args.kind, feature_dim=meta.feature_dim,
                             text_vocab_size=meta.text_vocab_size, hidden=args.hidden,
                             draft_model_id=meta.draft_model_id,
                             vocab_fingerprint=meta.vocab_fingerprint)
    head = build_head(config)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps,
                                                pct_start=0.1)
    start_id = meta.text_vocab_size
    t0 = time.perf_counter()
    head.train()
    losses: list[float] = []
    for step in range(args.steps):
        feats, fed, labels, mask = padded(rng.sample(train, min(args.batch, len(train))),
                                          start_id)
        logits = head(feats, fed, mask)  # [B, n, V]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                 ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 250 == 0 or step == args.steps - 1:
            log.info("%s step %d/%d loss %.4f", args.kind, step + 1, args.steps,
                     float(np.mean(losses[-50:])))
    head.eval()
    metrics: dict[str, object] = {
        "kind": args.kind, "log_source": meta.source, "draft_model_id": meta.draft_model_id,
        "train_requests": len(train), "held_out_requests": len(held),
        "train_positions": int(sum(len(r.tokens) for r in train)),
        "steps": args.steps, "batch": args.batch, "hidden": args.hidden, "lr": args.lr,
        "seed": args.seed, "final_loss": round(float(np.mean(losses[-50:])), 4),
        "train_seconds": round(time.perf_counter() - t0, 1),
        "held_out_top1": round(top1_match(head, held, start_id), 4),
        "parameters": sum(p.numel() for p in head.parameters()),
        "macs_per_token": macs_per_token(head),
    }
    head.config = replace(config, training=metrics)
    return head, metrics


CARD = """# {name}

A {what} for `eventspec-edge serve --draft-head DIR`: it reads the drafter's last hidden
state at each position and predicts the token the cloud verifier commits next; the edge
drafts its argmax, and the cloud verifies as always (greedy output is unchanged).
Trained by `eventspec-edge train-adapter` from a commit log of `{draft}` (token ids and
hidden states only, never raw events). It pairs with that drafter only.

```json
{metrics}
```
"""


def train_from_log(log_dir: Path, out: Path, args: HeadTraining) -> dict[str, object]:
    """Read ``log_dir``, train, write the model directory ``out``; returns the metrics."""
    if out.exists() and any(out.iterdir()):
        raise InvalidInput(f"{out} is not empty; choose a new --out directory")
    meta, requests = read_log(log_dir)
    head, metrics = train_head(meta, requests, args)
    what = ("token adapter (LayerNorm, MLP)" if args.kind == "adapter" else
            "distilled draft head (EAGLE-style: features + committed tokens, one causal "
            "attention layer)")
    save_head(head, out, CARD.format(name=out.name, what=what, draft=meta.draft_model_id,
                                     metrics=json.dumps(metrics, indent=2)))
    return metrics
