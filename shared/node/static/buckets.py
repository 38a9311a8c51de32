"""The static engine's padded step shapes: the (sessions, tokens) buckets a CUDA graph is
captured for, and the layout of the step's index arrays in one int64 block.

Kept apart from ``eventspec.cloud.engine.static.engine`` so the engine module holds the forward
passes
and this one the bookkeeping of shapes they run at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the cloud's settings read the buckets without torch
    import torch

SESSION_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
TOKEN_BUCKETS: tuple[int, ...] = (1, 2, 3, 5, 9, 17, 33)
#: Queries per pseudo-session of a prompt piece in a graphed mixed step
#: (:mod:`.chunk_staging`); here so the cloud's settings read it without torch.
CHUNK_TILE = 64
#: Pieces one graphed mixed step carries at most (:mod:`.chunk_staging`); here, as
#: :data:`CHUNK_TILE`, so the cloud's scheduler reads it without torch.
MAX_PIECES = 4
#: Mixed steps run at fixed shapes only with at most this many tokens per session (8
#: drafts): each further token bucket would capture another graph per piece bucket.
#: (:mod:`.mixed_steps`; here so the cloud's scheduler reads it without torch.)
MIXED_MAX_TOKENS = 9


@dataclass(frozen=True)
class StepInputs:
    """Device tensors one padded step reads (views of static buffers under graphs)."""

    ids: torch.Tensor  # [M] token ids, M = Bp * Qp
    pos: torch.Tensor  # [M] positions (RoPE rows)
    write_slot: torch.Tensor  # [M] slot each row's K/V goes to (scratch for padding)
    write_pos: torch.Tensor  # [M] position in that slot
    slots: torch.Tensor  # [Bp]
    starts: torch.Tensor  # [Bp]
    seq_lens: torch.Tensor  # [Bp] start + count: what attention may read
    sessions: int  # Bp
    tokens: int  # Qp


@dataclass(frozen=True)
class MetaLayout:
    """Where each index array sits in one int64 block (fixed offsets per capacity)."""

    cap_m: int
    cap_b: int

    @property
    def size(self) -> int:
        return 3 * self.cap_m + 3 * self.cap_b

    def views(self, meta: torch.Tensor, bp: int, qp: int) -> tuple[torch.Tensor, ...]:
        """(pos, write_slot, write_pos, slots, starts, seq_lens) prefixes for (Bp, Qp)."""
        m, cm, cb = bp * qp, self.cap_m, self.cap_b
        return (
            meta[:m],
            meta[cm : cm + m],
            meta[2 * cm : 2 * cm + m],
            meta[3 * cm : 3 * cm + bp],
            meta[3 * cm + cb : 3 * cm + cb + bp],
            meta[3 * cm + 2 * cb : 3 * cm + 2 * cb + bp],
        )


def bucket(n: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``n`` (None when ``n`` is beyond the largest)."""
    for b in buckets:
        if b >= n:
            return b
    return None
