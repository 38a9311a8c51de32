"""Where ``--model`` names point: the shipped toy target, or a directory the user gives.

The cloud only ever loads a model directory. ``toy`` names the trained demo target
shipped as package data; ``tiny-random`` is written to a temporary directory by the
demo world at the CLI's edge (:mod:`eventspec.cloud.cli`), then loaded like any other.
"""

from __future__ import annotations

from pathlib import Path

TOY = "toy"
TINY_RANDOM = "tiny-random"
#: What ``--model`` takes besides a checkpoint directory.
BUILTIN_MODELS = (TOY, TINY_RANDOM)
SHIPPED_MODELS = Path(__file__).resolve().parent / "models"
TOY_TARGET_DIR = SHIPPED_MODELS / "toy-video-llava"


def model_dir(name: str) -> Path:
    """The directory ``--model name`` loads: the shipped toy target for ``toy``."""
    return TOY_TARGET_DIR if name == TOY else Path(name)
