"""The settings of ``eventspec-edge train-adapter``, without torch (the CLI's defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from eventspec.shared.contract.errors import InvalidInput


@dataclass(frozen=True)
class HeadTraining:
    """One training run's settings (``eventspec-edge train-adapter --help``)."""

    kind: Literal["adapter", "head"] = "adapter"
    steps: int = 1500
    batch: int = 64
    hidden: int = 128
    lr: float = 3e-3
    holdout: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.hidden < 1:
            raise InvalidInput("--steps, --batch and --hidden must be >= 1")
        if not 0.0 <= self.holdout < 1.0:
            raise InvalidInput(f"--holdout must be in [0, 1), got {self.holdout}")
