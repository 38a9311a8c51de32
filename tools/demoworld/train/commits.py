"""Toy commit logs and the offline speculation that judges drafting backends.

Why: ``eventspec-edge train-adapter`` learns from what an edge logs at committed
positions (``eventspec.edge.learning.commit_log``). In the toy world the same rows can be made
without running the nodes: the target's greedy answer is what the cloud commits (it
verifies greedily, so speculative output is token-identical to target-only), and
feeding that answer to the drafter gives its hidden state at each committed position,
exactly as the edge's drafter computes them once synced to the commits. The same
reasoning lets :func:`speculate` replay greedy speculation against the target's
answer to count accepted drafts for any drafting backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from eventspec.cloud.target import TargetModel
from eventspec.demoworld.train.common import examples_for, normalise
from eventspec.demoworld.train.draft import event_frames_for
from eventspec.demoworld.train.target import frames_for, greedy_answer_ids
from eventspec.edge.drafting.cache import DraftBackend, DraftCache
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.learning.commit_log import CommitLogWriter, LogMeta
from eventspec.shared.toyworld.qa import QA


@dataclass(frozen=True)
class Example:
    """One question about one scene: its event pixels, the target's answer ids (EOS
    included when the answer ended there)."""

    seed: int
    qa: QA
    pixels: torch.Tensor  # [5, 3, S, S], CLIP-normalised event frames
    answer: tuple[int, ...]


def toy_examples(target: TargetModel, seeds: Sequence[int], max_new: int = 12,
                 workers: int = 1) -> list[Example]:
    """Every question of every scene, with the target's answer and the event pixels."""
    seeds = list(seeds)
    rgb = torch.from_numpy(frames_for(seeds, workers))  # [N, 8, H, W, 3]
    events = normalise(torch.from_numpy(event_frames_for(seeds, workers)))  # [N, 5, 3, S, S]
    items = examples_for(seeds)
    out: list[Example] = []
    for start in range(0, len(items), 128):
        chunk = items[start : start + 128]
        answers = greedy_answer_ids(target, rgb[[i for i, _ in chunk]],
                                    [qa.question for _, qa in chunk], max_new)
        out.extend(Example(seeds[i], qa, events[i], tuple(a))
                   for (i, qa), a in zip(chunk, answers, strict=True))
    return out


def committed_features(draft: DraftModel, ex: Example) -> np.ndarray:
    """The drafter's hidden states at each committed position of ``ex``. [n, H] float32."""
    state, first, _ = draft.prefill_features(ex.qa.question, ex.pixels.to(draft.dtype))
    rows = [first[None]]  # [1, H]
    if len(ex.answer) > 1:
        rows.append(draft.step_features(state, ex.answer[:-1])[0])  # [n - 1, H]
    return torch.cat(rows).cpu().numpy()


def write_toy_log(draft: DraftModel, examples: Sequence[Example], out: Path, source: str,
                  max_bytes: int = 1 << 30) -> CommitLogWriter:
    """A commit log of ``examples`` as an edge with ``draft`` would have written it."""
    meta = LogMeta(draft_model_id=draft.model_id, vocab_fingerprint=draft.vocab_fingerprint,
                   feature_dim=int(draft.model.config.hidden_size),
                   text_vocab_size=draft.text_vocab_size, source=source)
    writer = CommitLogWriter(out, meta, max_bytes=max_bytes)
    for ex in examples:
        writer.add(committed_features(draft, ex), np.asarray(ex.answer))
    writer.flush()
    return writer


@dataclass
class SpecCounts:
    """Greedy speculation replayed against the target's answers, k drafts per step."""

    depth: int
    questions: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    committed: int = 0
    #: Per draft position i: steps whose drafts 0..i-1 were all right (draft i judged
    #: on a right prefix), and of those, steps where draft i was right too.
    reached: list[int] = field(default_factory=list)
    right: list[int] = field(default_factory=list)
    #: Per-answer-position top-1 matches under the target's prefix (k = 1 acceptance).
    top1_right: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reached = [0] * self.depth
        self.right = [0] * self.depth

    def summary(self) -> dict[str, object]:
        steps = max(self.steps, 1)
        return {
            "questions": self.questions, "drafted": self.drafted, "accepted": self.accepted,
            "target_steps": self.steps,
            "top1_acceptance": round(float(np.mean(self.top1_right)), 4),
            "acceptance_rate": round(self.accepted / max(self.drafted, 1), 4),
            "acceptance_by_position": [round(r / n, 4) if n else None
                                       for r, n in zip(self.right, self.reached, strict=True)],
            "tau": round(self.committed / steps, 4),
        }


def top1_matches(backend: DraftBackend, examples: Sequence[Example]) -> list[bool]:
    """Per answer position: is the backend's draft the target's token, given the target's
    prefix? (The seed work's top-1 acceptance; with one draft per step, exactly which
    drafts are accepted.)"""
    right: list[bool] = []
    for ex in examples:
        drafter = DraftCache(backend)
        drafter.prefill(ex.qa.question, ex.pixels)
        truth = list(ex.answer)
        right.extend(drafter.draft_next(truth[:p]) == truth[p] for p in range(len(truth)))
    return right


def speculate(backend: DraftBackend, examples: Sequence[Example], depth: int) -> SpecCounts:
    """Replay greedy speculation (``depth`` drafts, then the target's step) per example.

    The target commits its greedy answer whatever is drafted, so each step accepts the
    drafts that match the answer from the commit point, then one target token.
    """
    counts = SpecCounts(depth)
    counts.top1_right = top1_matches(backend, examples)
    for ex in examples:
        drafter = DraftCache(backend)
        drafter.prefill(ex.qa.question, ex.pixels)
        truth = list(ex.answer)
        done = 0
        while done < len(truth):
            drafts: list[int] = []
            for _ in range(depth):
                drafts.append(drafter.draft_next(truth[:done] + drafts))
                if drafts[-1] == backend.eos_token_id:
                    break
            ok = 0
            while ok < len(drafts) and done + ok < len(truth) and drafts[ok] == truth[done + ok]:
                ok += 1
            for i in range(min(ok + 1, len(drafts))):
                counts.reached[i] += 1
                counts.right[i] += i < ok
            counts.drafted += len(drafts)
            counts.accepted += ok
            counts.steps += 1
            step_commit = min(ok + 1, len(truth) - done)
            counts.committed += step_commit
            done += step_commit
        counts.questions += 1
    return counts
