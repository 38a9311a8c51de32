"""The drafting backend that proposes a token adapter's or draft head's argmax.

Why: with ``--draft-head DIR`` the edge drafts what a small network predicts the
*target* commits next from the drafter's features (``eventspec.edge.learning.token_heads``),
not the drafter's own next token. It wraps the HF drafter (``DraftModel``): the drafter
still runs one forward per fed token, the head reads its hidden state, and the
logits the :class:`~eventspec.edge.drafting.cache.DraftCache` sees are the head's. Rollback crops
both caches. The cloud verifies as always, so greedy output is unchanged: only which
tokens are proposed, and so how many are accepted, differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from eventspec.edge.drafting.eventgpt import DraftModel, DraftState
from eventspec.edge.learning.token_heads import HeadCache, TokenHead
from eventspec.shared.contract.errors import InvalidInput


@dataclass
class HeadedState:
    """One request: the drafter's KV cache and the head's positions."""

    draft: DraftState
    head: HeadCache


class HeadedDraftBackend:
    """``DraftBackend`` (:mod:`eventspec.edge.drafting.cache`): drafter features -> head logits."""

    def __init__(self, draft: DraftModel, head: TokenHead, name: str = "") -> None:
        config = head.config
        if config.text_vocab_size != draft.text_vocab_size:
            raise InvalidInput(f"the token head predicts {config.text_vocab_size} ids, the "
                               f"drafter's text vocabulary has {draft.text_vocab_size}")
        hidden = int(draft.model.config.hidden_size)
        if config.feature_dim != hidden:
            raise InvalidInput(f"the token head reads {config.feature_dim}-wide features, "
                               f"the drafter's hidden size is {hidden}")
        if config.vocab_fingerprint and config.vocab_fingerprint != draft.vocab_fingerprint:
            raise InvalidInput("the token head was trained with another text vocabulary "
                               f"(drafter {config.draft_model_id!r})")
        self.draft = draft
        self.head = head.to(draft.device)
        self.text_vocab_size = draft.text_vocab_size
        self.eos_token_id = draft.eos_token_id
        #: Answer-start id: the head's input token at the position after the prompt.
        self.start_id = draft.text_vocab_size
        self.name = name or f"hf + {config.kind}"

    @torch.no_grad()
    def prefill(
        self, question: str, pixel_values: torch.Tensor | None, *,
        clip_features: torch.Tensor | None = None,
    ) -> tuple[HeadedState, torch.Tensor]:
        """The drafter's prefill, then the head's first position -> logits [V]."""
        state, hidden, _ = self.draft.prefill_features(
            question, pixel_values, clip_features=clip_features)  # [H]
        cache = HeadCache()
        start = torch.tensor([self.start_id], device=hidden.device)
        rows = self.head.step(cache, hidden[None], start)  # [1, V]
        return HeadedState(state, cache), rows[0].float()

    @torch.no_grad()
    def step(self, state: HeadedState, tokens: Sequence[int]) -> torch.Tensor:
        """Feed ``tokens`` -> the head's logits after each [len(tokens), V]."""
        hidden, _ = self.draft.step_features(state.draft, tokens)  # [k, H]
        fed = torch.tensor([int(t) for t in tokens], device=hidden.device)  # [k]
        rows: torch.Tensor = self.head.step(state.head, hidden, fed)
        return rows.float()

    def rollback(self, state: HeadedState, keep_len: int) -> None:
        """Cut both caches: the head keeps one position per drafter position past the
        prompt, plus the one after the prompt."""
        self.draft.rollback(state.draft, keep_len)
        state.head.crop(self.draft.seq_len(state.draft) - state.draft.prompt_len + 1)

    def seq_len(self, state: HeadedState) -> int:
        return self.draft.seq_len(state.draft)

    def greedy_next(self, logits_row: torch.Tensor) -> int:
        return int(torch.argmax(logits_row[..., : self.text_vocab_size], dim=-1))
