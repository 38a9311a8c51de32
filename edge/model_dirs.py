"""Where ``--model`` / ``--adapter`` names point: the shipped toy pair, or a directory.

The edge only ever loads model directories. ``toy`` names the trained demo draft and
its feature adapter, shipped as package data; ``tiny-random`` is written to a
temporary directory by the demo world at the CLI's edge (:mod:`eventspec.edge.cli`), then
loaded like any other.
"""

from __future__ import annotations

from pathlib import Path

TOY = "toy"
TINY_RANDOM = "tiny-random"
SHIPPED_MODELS = Path(__file__).resolve().parent / "models"
TOY_DRAFT_DIR = SHIPPED_MODELS / "toy-eventgpt"
TOY_ADAPTER_DIR = SHIPPED_MODELS / "toy-adapter"


def draft_dir(name: str) -> Path:
    """The directory ``--model name`` loads: the shipped toy draft for ``toy``."""
    return TOY_DRAFT_DIR if name == TOY else Path(name)


def adapter_dir(name: str | Path) -> Path:
    """The directory ``--adapter name`` loads: the shipped toy adapter for ``toy``."""
    return TOY_ADAPTER_DIR if str(name) == TOY else Path(name)
