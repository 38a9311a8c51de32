"""One batched step's input: what every static-KV caller (the cloud's scheduler, the
edge's drafter) hands the runtime."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepBatch:
    """Flattened tokens of B sessions, with per-session counts (vLLM's cu_num_draft_tokens).

    ``token_ids`` holds, for each session in order, its last committed token followed by
    its drafts: ``counts[i]`` ids (at least 1) for ``slots[i]``, written at positions
    ``start_positions[i] ...`` of that slot.
    """

    slots: tuple[int, ...]  # [B]
    start_positions: tuple[int, ...]  # [B]
    counts: tuple[int, ...]  # [B], each >= 1
    token_ids: torch.Tensor  # [N = sum(counts)] int64, on the engine's device

    @property
    def num_tokens(self) -> int:
        return sum(self.counts)
