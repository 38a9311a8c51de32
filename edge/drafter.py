"""The draft model's KV cache for one request, kept in sync with a token sequence.

``eventspec.edge.session`` decides what to draft after (the committed answer C plus the edge's
tail); this class computes the greedy token after any such context. Its cache holds
``prompt + fed`` and the logits after it. Asked for a new context, it crops the cache to
the longest prefix the two share and feeds the rest in one forward, so a Commit that
cuts the tail costs one crop plus feeding the committed tokens, never a re-prefill
(DESIGN, "Commits"), and the cache can never hold a token twice.

All methods do model work and must run on the edge's single model thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch


class DraftBackend(Protocol):
    """The parts of ``eventspec.edge.draft.DraftModel`` the drafter needs."""

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


#: Draft calls one request's timeline keeps.
MAX_SPANS = 256


class Drafter:
    """Prefill, then greedy drafting after whatever context the session names."""

    def __init__(self, backend: DraftBackend) -> None:
        self.backend = backend
        self._state: Any = None
        self._prompt_len = 0
        self._fed: list[int] = []  # tokens after the prompt whose KV the cache holds
        self._prefill_logits: torch.Tensor | None = None  # [V], after the prompt
        self.last_logits: torch.Tensor | None = None  # [V], after ``self._fed``
        self.prefill_ms = 0.0
        self.draft_ms_total = 0.0
        self.drafted_total = 0
        self.rollbacks = 0
        #: perf_counter at the prefill's start and end (a request's timeline).
        self.prefill_span: tuple[float, float] | None = None
        #: Set to a list to log each draft call's (start, end) perf_counter, up to
        #: ``MAX_SPANS`` (a request's timeline); None: nothing is kept.
        self.spans: list[tuple[float, float]] | None = None

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
        # The prefill ends when its logits can be read: on a GPU its kernels are still
        # queued here, and unmeasured the first draft paid for them (an int4 drafter
        # measured 41 ms a token and a 27 ms prefill, against 3.2 ms and about 300 ms:
        # the GPU gate, issue 35). Reading the first token waits for them, on any device.
        self.backend.greedy_next(logits)
        self._prompt_len = self.backend.seq_len(self._state)
        self._prefill_logits = logits
        self.last_logits = logits
        self._fed = []
        t1 = time.perf_counter()
        self.prefill_ms = (t1 - t0) * 1e3
        self.prefill_span = (t0, t1)
        return self.prefill_ms

    def draft_next(self, context: Sequence[int]) -> int:
        """The greedy token after ``prompt + context`` (at most one forward)."""
        if self._state is None or self._prefill_logits is None:
            raise RuntimeError("draft before prefill")
        t0 = time.perf_counter()
        ctx = [int(t) for t in context]
        if ctx != self._fed or self.last_logits is None:
            self.last_logits = self._sync(ctx)
        token = self.backend.greedy_next(self.last_logits)
        t1 = time.perf_counter()
        self.draft_ms_total += (t1 - t0) * 1e3
        self.drafted_total += 1
        if self.spans is not None and len(self.spans) < MAX_SPANS:
            self.spans.append((t0, t1))
        return token

    def _sync(self, ctx: list[int]) -> torch.Tensor:
        """Make the cache hold ``prompt + ctx``; return the logits after it [V]."""
        shared = 0
        while shared < min(len(ctx), len(self._fed)) and ctx[shared] == self._fed[shared]:
            shared += 1
        # The newest context token must be fed to get its successor's logits.
        keep = min(shared, max(len(ctx) - 1, 0))
        if keep < len(self._fed):
            self.backend.rollback(self._state, self._prompt_len + keep)
            self.rollbacks += 1
        self._fed = ctx[:keep]
        if not ctx:
            assert self._prefill_logits is not None
            return self._prefill_logits
        rows = self.backend.step(self._state, ctx[keep:])  # [len(ctx) - keep, V]
        self._fed = ctx
        return rows[-1]

    @property
    def expands_in_one_forward(self) -> bool:
        """Whether the backend expands several contexts in one forward (``expand``, with
        ``expands_trees`` true): only then does a draft tree pay, so the edge sends trees
        (issue 36); others draft chains."""
        return bool(getattr(self.backend, "expands_trees", False))

    def expand(self, contexts: Sequence[Sequence[int]], k: int
               ) -> list[list[tuple[int, float]]]:
        """The top-``k`` ``(token, log-probability)`` after each ``prompt + context``: in one
        forward where the backend can (``expand``), else one synced step per context."""
        if self._state is None or self._prefill_logits is None:
            raise RuntimeError("draft before prefill")
        t0 = time.perf_counter()
        batched = getattr(self.backend, "expand", None) if self.expands_in_one_forward else None
        if callable(batched):
            out: list[list[tuple[int, float]]] = batched(self._state, contexts, k)
        else:
            out = []
            for context in contexts:
                ctx = [int(t) for t in context]
                if ctx != self._fed or self.last_logits is None:
                    self.last_logits = self._sync(ctx)
                out.append(top_k(self.last_logits, self.backend.text_vocab_size, k))
        t1 = time.perf_counter()
        self.draft_ms_total += (t1 - t0) * 1e3
        self.drafted_total += 1 if callable(batched) else max(1, len(contexts))  # forwards
        if self.spans is not None and len(self.spans) < MAX_SPANS:
            self.spans.append((t0, t1))
        return out

    @property
    def ms_per_token(self) -> float:
        return self.draft_ms_total / self.drafted_total if self.drafted_total else 0.0

    def cached_len(self) -> int:
        """Positions the draft cache holds (prompt + fed tokens)."""
        return int(self.backend.seq_len(self._state)) if self._state is not None else 0


def top_k(logits: torch.Tensor, text_vocab_size: int, k: int) -> list[tuple[int, float]]:
    """The ``k`` likeliest text tokens of one row of logits [V], with log-probabilities
    over the text vocabulary."""
    logp = torch.log_softmax(logits[..., :text_vocab_size].float(), dim=-1)  # [V_text]
    values, ids = torch.topk(logp, min(k, text_vocab_size))
    return [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
