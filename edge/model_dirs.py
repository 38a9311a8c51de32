"""Where ``--model`` / ``--adapter`` names point: the shipped toy pair, or a directory.

The edge only ever loads model directories. ``toy`` names the trained demo draft and
its feature adapter, shipped as package data; ``toy-misaligned`` the demo drafter
retrained on other wording (issue 22: low raw acceptance, for token adapters and draft
heads to fix), whose vision path, and so feature adapter, is the aligned one's;
``tiny-random`` is written to a temporary directory by the demo world at the CLI's edge
(:mod:`eventspec.edge.cli`), then loaded like any other.
"""

from __future__ import annotations

from pathlib import Path

TOY = "toy"
TOY_MISALIGNED = "toy-misaligned"
TINY_RANDOM = "tiny-random"
#: What ``--model`` takes besides a checkpoint directory.
BUILTIN_MODELS = (TOY, TOY_MISALIGNED, TINY_RANDOM)
SHIPPED_MODELS = Path(__file__).resolve().parent / "models"
TOY_DRAFT_DIR = SHIPPED_MODELS / "toy-eventgpt"
TOY_ADAPTER_DIR = SHIPPED_MODELS / "toy-adapter"
TOY_MISALIGNED_DIR = SHIPPED_MODELS / "toy-eventgpt-misaligned"
#: A token adapter and a draft head for the misaligned drafter (``--draft-head``),
#: trained by ``benchmarks/bench_token_adapter.py`` through ``train-adapter``.
TOY_TOKEN_ADAPTER_DIR = SHIPPED_MODELS / "toy-token-adapter"
TOY_DRAFT_HEAD_DIR = SHIPPED_MODELS / "toy-draft-head"


def draft_dir(name: str) -> Path:
    """The directory ``--model name`` loads: the shipped toy drafts for ``toy`` and
    ``toy-misaligned``."""
    return {TOY: TOY_DRAFT_DIR, TOY_MISALIGNED: TOY_MISALIGNED_DIR}.get(name, Path(name))


def adapter_dir(name: str | Path) -> Path:
    """The directory ``--adapter name`` loads: the shipped toy adapter for ``toy``."""
    return TOY_ADAPTER_DIR if str(name) == TOY else Path(name)
