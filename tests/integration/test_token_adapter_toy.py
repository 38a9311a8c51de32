"""A token adapter trained on a tiny toy commit log beats the raw misaligned drafter on
held-out scenes, by a paired exact test at a fixed seed (not one lucky sample), and a
draft head trains on CPU at tiny size too.

The log is what an edge with ``--commit-log`` writes (the drafter's hidden states at
the toy target's committed positions); the held-out scenes are evaluation seeds no
model was trained on. Positions where exactly one of the two drafts is right are the
evidence (McNemar's exact test): under "no better", the adapter wins each such
position with probability 1/2.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from eventspec.demoworld.train.commits import top1_matches, toy_examples, write_toy_log
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.drafting.headed_backend import HeadedDraftBackend
from eventspec.edge.learning.token_heads import load_head
from eventspec.edge.learning.train import train_from_log
from eventspec.edge.learning.train_settings import HeadTraining
from eventspec.edge.model_dirs import TOY_MISALIGNED_DIR
from tests.support.edge_harness import toy_target

HELD_OUT = range(2_004_000, 2_004_012)


def one_sided_sign_p(wins: int, losses: int) -> float:
    """P(X >= wins) for X ~ Binomial(wins + losses, 1/2)."""
    n = wins + losses
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / (1 << n)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models on a shared 2-core machine: one intra-op thread is ~10x faster than
    two contending ones here."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def commit_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("commits")
    write_toy_log(load_draft(TOY_MISALIGNED_DIR), toy_examples(toy_target(), range(25)),
                  root, "toy scenes 0-24")
    return root


def test_a_trained_adapter_beats_the_raw_drafter_on_held_out_scenes(
        commit_log: Path, tmp_path: Path) -> None:
    metrics = train_from_log(commit_log, tmp_path / "adapter",
                             HeadTraining(kind="adapter", steps=150, batch=32, hidden=64,
                                          lr=5e-3, seed=0))
    raw = load_draft(TOY_MISALIGNED_DIR)
    held = toy_examples(toy_target(), HELD_OUT)
    before = top1_matches(raw, held)
    after = top1_matches(HeadedDraftBackend(raw, load_head(tmp_path / "adapter")), held)
    wins = sum(a and not b for a, b in zip(after, before, strict=True))
    losses = sum(b and not a for a, b in zip(after, before, strict=True))
    rate_before, rate_after = sum(before) / len(before), sum(after) / len(after)
    assert one_sided_sign_p(wins, losses) < 1e-3, (wins, losses, rate_before, rate_after)
    assert rate_after > 2 * rate_before, (rate_before, rate_after, metrics)


def test_a_draft_head_trains_on_cpu_at_tiny_size(commit_log: Path, tmp_path: Path) -> None:
    metrics = train_from_log(commit_log, tmp_path / "head",
                             HeadTraining(kind="head", steps=100, batch=32, hidden=48, seed=0))
    assert float(metrics["held_out_top1"]) > 0.3, metrics  # type: ignore[arg-type]
    head = load_head(tmp_path / "head")
    assert head.config.kind == "head" and head.config.draft_model_id
