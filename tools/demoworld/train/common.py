"""What the three toy trainers share: frame batching, the auxiliary attribute heads,
the learning-rate schedule, seeding, accuracy by question type and model cards."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from eventspec.shared.node.imageproc import CLIP_MEAN, CLIP_STD
from eventspec.shared.toyworld.labels import HEADS, IGNORE
from eventspec.shared.toyworld.qa import QA, all_questions, parse_answer
from eventspec.shared.toyworld.scenes import sample_scene


def examples_for(seeds: Sequence[int]) -> list[tuple[int, QA]]:
    """(index into ``seeds``, question) for every applicable question of every scene."""
    return [(i, qa) for i, s in enumerate(seeds) for qa in all_questions(sample_scene(s))]


def normalise(frames_u8: torch.Tensor) -> torch.Tensor:
    """[B, F, H, W, 3] uint8 -> CLIP-normalised [B, F, 3, H, W] float32.

    The same arithmetic as ``eventspec.shared.node.imageproc.clip_preprocess`` when the frames are
    already at the tower's size (64 px in the toy world), done on the training device.
    """
    x = frames_u8.permute(0, 1, 4, 2, 3).float().div_(255.0)
    mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 1, 3, 1, 1)
    std = torch.tensor(CLIP_STD, device=x.device).view(1, 1, 3, 1, 1)
    return (x - mean) / std


class AuxHeads(torch.nn.Module):
    """Linear attribute classifiers on per-frame [CLS, mean] vision features.

    Used only while training: they give the vision tower a direct signal about what
    the answers depend on (see ``eventspec.shared.toyworld.labels``). Not saved with the model.
    """

    def __init__(self, frames: int, dim: int, heads: Sequence[str]) -> None:
        super().__init__()
        self.heads = torch.nn.ModuleDict(
            {h: torch.nn.Linear(frames * 2 * dim, len(HEADS[h])) for h in heads}
        )

    def forward(self, feats: torch.Tensor, labels: dict[str, torch.Tensor]) -> torch.Tensor:
        """feats [B, F, T, D] -> summed cross-entropy over the heads."""
        pooled = torch.cat([feats[:, :, 0], feats[:, :, 1:].mean(2)], dim=-1).flatten(1)
        loss = feats.new_zeros(())
        for name, head in self.heads.items():
            loss = loss + torch.nn.functional.cross_entropy(
                head(pooled.float()), labels[name], ignore_index=IGNORE
            )
        return loss


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10% of ``peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def seed_everything(seed: int) -> None:
    """Seed every generator and ask for deterministic kernels (training is repeatable)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


def device_name(device: torch.device) -> str:
    """For model cards: the GPU's name, or "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def optimise(
    opt: torch.optim.Optimizer, loss: torch.Tensor, params: Sequence[torch.nn.Parameter],
    lr: float,
) -> None:
    """One AdamW step at learning rate ``lr`` with gradients clipped to norm 1."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


class TrainProgress:
    """Loss bookkeeping and the periodic progress line of a training run."""

    def __init__(self, name: str, total: int, every: int, log: logging.Logger) -> None:
        self.name, self.total, self.every, self.log = name, total, every, log
        self.losses: list[float] = []
        self.aux_losses: list[float] = []
        self.started = time.perf_counter()

    def record(self, step: int, loss: float, aux: float, lr: float) -> None:
        self.losses.append(loss)
        self.aux_losses.append(aux)
        if step % self.every == 0 or step == self.total - 1:
            self.log.info("%s step %d/%d loss %.4f aux %.3f lr %.2e (%.0f s)", self.name,
                          step + 1, self.total, float(np.mean(self.losses[-self.every:])),
                          float(np.mean(self.aux_losses[-self.every:])), lr, self.seconds)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    @property
    def final_loss(self) -> float:
        return float(np.mean(self.losses[-50:]))


def accuracy_by_type(
    items: Sequence[tuple[int, QA]],
    frames: torch.Tensor,
    answer: Callable[[torch.Tensor, list[str]], list[str]],
    batch: int = 64,
) -> dict[str, float]:
    """Accuracy by question type, scored on structured answers.

    ``items`` pair an index into ``frames`` with a question; ``answer`` maps a batch of
    frames and questions to answer texts (either model's batched greedy decoder).
    """
    right: dict[str, list[bool]] = {}
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        texts = answer(frames[[i for i, _ in chunk]], [qa.question for _, qa in chunk])
        for (_, qa), text in zip(chunk, texts, strict=True):
            right.setdefault(qa.qtype, []).append(parse_answer(qa.qtype, text) == qa.value)
    return {k: round(sum(v) / len(v), 4) for k, v in sorted(right.items())}


def write_card(out: Path, name: str, text: str, metrics: dict[str, object]) -> None:
    """The model card (``README.md``) and ``training.json`` of a trained model directory."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(
        f"# {name}\n\n{text}\n\nTrained by `eventspec toy train`.\n\n```json\n"
        f"{json.dumps(metrics, indent=2)}\n```\n"
    )
    (out / "training.json").write_text(json.dumps(metrics, indent=2))
