"""Greedy drafting on the edge, with rollback when the cloud's commits diverge.

The drafter mirrors the cloud's committed sequence C and keeps its own speculative
tail beyond it. Its KV cache always holds ``prompt + (C + tail)[:-1]``: the newest token
is not yet fed, and its successor is computed only when the next draft is wanted, so a
Commit that disagrees costs one cache crop plus feeding the committed tokens, never a
re-prefill (DESIGN, "Commits").

All methods do model work and must run on the edge's single model thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from shared.errors import InvalidInput


class DraftBackend(Protocol):
    """The parts of ``edge.draft.DraftModel`` the drafter needs."""

    text_vocab_size: int
    eos_token_id: int

    def prefill(
        self, question: str, pixel_values: torch.Tensor | None, *,
        clip_features: torch.Tensor | None = None,
    ) -> tuple[Any, torch.Tensor]: ...

    def step(self, state: Any, tokens: Sequence[int]) -> torch.Tensor: ...

    def rollback(self, state: Any, keep_len: int) -> None: ...

    def seq_len(self, state: Any) -> int: ...

    def greedy_next(self, logits_row: torch.Tensor) -> int: ...


@dataclass
class CommitOutcome:
    """How a Commit related to the drafter's tail."""

    kept: int  # tail tokens confirmed by the commit
    rolled_back: bool  # the tail diverged and the cache was cropped


class Drafter:
    """Prefill, then greedy drafting that can start the moment prefill ends."""

    def __init__(self, backend: DraftBackend, max_new_tokens: int) -> None:
        self.backend = backend
        self.max_new_tokens = max_new_tokens
        self.committed: list[int] = []
        self.tail: list[int] = []
        self._state: Any = None
        self._prompt_len = 0
        self._next_logits: torch.Tensor | None = None  # [V], successor of committed+tail
        self.prefill_ms = 0.0
        self.draft_ms_total = 0.0
        self.drafted_total = 0
        self.rollbacks = 0

    @property
    def sequence(self) -> list[int]:
        return self.committed + self.tail

    def prefill(
        self, question: str, pixel_values: torch.Tensor,
        clip_features: torch.Tensor | None = None,
    ) -> float:
        """Run the draft model's prefill (events + prompt). Returns ms.

        ``clip_features`` [5, T, D], when the aligned path already ran CLIP on these
        pixels, spares running it again."""
        t0 = time.perf_counter()
        self._state, logits = self.backend.prefill(
            question, pixel_values, clip_features=clip_features
        )
        self._prompt_len = self.backend.seq_len(self._state)
        self._next_logits = logits
        self.prefill_ms = (time.perf_counter() - t0) * 1e3
        return self.prefill_ms

    def can_draft(self) -> bool:
        """False once the tail ends in EOS or reaches max_new_tokens."""
        seq = self.sequence
        if len(seq) >= self.max_new_tokens:
            return False
        return not (seq and seq[-1] == self.backend.eos_token_id)

    def draft_one(self) -> int:
        """Extend the tail by one greedy token (one forward unless logits are cached)."""
        if self._state is None:
            raise RuntimeError("draft before prefill")
        t0 = time.perf_counter()
        if self._next_logits is None:
            seq = self.sequence
            logits = self.backend.step(self._state, [seq[-1]])  # [1, V]
            self._next_logits = logits[-1]
        token = self.backend.greedy_next(self._next_logits)
        self._next_logits = None
        self.tail.append(token)
        self.draft_ms_total += (time.perf_counter() - t0) * 1e3
        self.drafted_total += 1
        return token

    @property
    def ms_per_token(self) -> float:
        return self.draft_ms_total / self.drafted_total if self.drafted_total else 0.0

    def on_commit(self, start: int, tokens: Sequence[int]) -> CommitOutcome:
        """Fold a cloud Commit into C; keep the tail if it agrees, else roll back.

        The cache is cropped to the longest prefix of ``prompt + C'`` it already holds;
        the committed tokens it lacks are fed lazily by the next ``draft_one``.
        """
        if start != len(self.committed):
            raise InvalidInput(
                f"Commit starts at {start}, but the edge has {len(self.committed)} committed tokens"
            )
        tokens = list(tokens)
        agree = 0
        while agree < min(len(tokens), len(self.tail)) and tokens[agree] == self.tail[agree]:
            agree += 1
        self.committed.extend(tokens)
        if agree == len(tokens):
            self.tail = self.tail[agree:]
            return CommitOutcome(kept=agree, rolled_back=False)
        # Divergence at tokens[agree] (or the tail ran out): crop to what still matches.
        self.tail = []
        if self._state is None:
            return CommitOutcome(kept=agree, rolled_back=False)
        cached = self.backend.seq_len(self._state)
        keep = min(cached, self._prompt_len + len(self.committed) - len(tokens) + agree)
        rolled = keep < cached
        if rolled:
            self.backend.rollback(self._state, keep)
            self.rollbacks += 1
        missing = self.committed[keep - self._prompt_len : -1]
        self._next_logits = None
        if missing:
            self.backend.step(self._state, missing)
        return CommitOutcome(kept=agree, rolled_back=rolled)
