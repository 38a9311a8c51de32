"""The draft model's KV cache for one request, kept in sync with a token sequence.

``eventspec.edge.ask.session`` decides what to draft after (the committed answer C plus the edge's
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
    """The parts of ``eventspec.edge.drafting.eventgpt.DraftModel`` the drafter needs."""

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


class DraftCache:
    """Prefill, then greedy drafting after whatever context the session names."""

    def __init__(self, backend: DraftBackend) -> None:
        self.backend = backend
        self._state: Any = None
        self._prompt_len = 0
        self._fed: list[int] = []  # tokens after the prompt whose KV the cache holds
        self._prefill_logits: torch.Tensor | None = None  # [V], after the prompt
        self.last_logits: torch.Tensor | None = None  # [V], after ``self._fed``
        self.prefill_ms = 0.0
        #: Time this session waited on draft forwards (its latency: what the plan prices).
        self.draft_ms_total = 0.0
        #: Its share of the edge's busy time: a forward shared by n sessions counts 1/n
        #: here (what the request's ``draft_forward_ms`` reports).
        self.draft_busy_ms = 0.0
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
        token = self.backend.greedy_next(self._sync([int(t) for t in context]))
        self._count(t0, time.perf_counter(), 1)
        return token

    def _sync(self, ctx: list[int]) -> torch.Tensor:
        """Make the cache hold ``prompt + ctx``; return the logits after it [V]."""
        feed = self._crop_for(ctx)
        if feed:
            self._took(ctx, self.backend.step(self._state, feed))  # [len(feed), V]
        assert self.last_logits is not None
        return self.last_logits

    def _crop_for(self, ctx: list[int]) -> list[int]:
        """Crop the cache to what ``ctx`` shares with it and return the tokens still to
        feed (none: ``last_logits`` already follows ``ctx``)."""
        if ctx == self._fed and self.last_logits is not None:
            return []
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
            self.last_logits = self._prefill_logits
            return []
        return ctx[keep:]

    def _took(self, ctx: list[int], rows: torch.Tensor) -> None:
        """The cache now holds ``prompt + ctx``; ``rows`` [k, V] end with its logits."""
        self._fed = ctx
        self.last_logits = rows[-1]

    def _count(self, t0: float, t1: float, forwards: int, sharers: int = 1) -> None:
        self.draft_ms_total += (t1 - t0) * 1e3
        self.draft_busy_ms += (t1 - t0) * 1e3 / max(1, sharers)
        self.drafted_total += forwards
        if self.spans is not None and len(self.spans) < MAX_SPANS:
            self.spans.append((t0, t1))

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
            out = [top_k(self._sync([int(t) for t in context]), self.backend.text_vocab_size, k)
                   for context in contexts]
        self._count(t0, time.perf_counter(), 1 if callable(batched) else max(1, len(contexts)))
        return out

    @property
    def ms_per_token(self) -> float:
        return self.draft_ms_total / self.drafted_total if self.drafted_total else 0.0

    def cached_len(self) -> int:
        """Positions the draft cache holds (prompt + fed tokens)."""
        return int(self.backend.seq_len(self._state)) if self._state is not None else 0


def draft_many(requests: Sequence[tuple[DraftCache, Sequence[int]]]) -> list[int]:
    """The greedy token after each ``(drafter, context)``: the drafters of one backend that
    steps several sessions together (``step_many``) feed in one forward; any other in
    its own (issue 36: an edge's sessions no longer take turns at the model).

    Each drafter's wait counts the whole forward it shared; its busy share, 1/n of it."""
    t0 = time.perf_counter()
    for d, _ in requests:
        if d._state is None or d._prefill_logits is None:
            raise RuntimeError("draft before prefill")
    contexts = [[int(t) for t in ctx] for _, ctx in requests]
    feeds = [d._crop_for(ctx) for (d, _), ctx in zip(requests, contexts, strict=True)]
    pending = [i for i, f in enumerate(feeds) if f]
    for group in _by_backend([requests[i][0] for i in pending], pending):
        backend = requests[group[0]][0].backend
        step_many = getattr(backend, "step_many", None)
        if callable(step_many) and len(group) > 1:
            rows = step_many([(requests[i][0]._state, feeds[i]) for i in group])
        else:
            rows = [backend.step(requests[i][0]._state, feeds[i]) for i in group]
        for i, r in zip(group, rows, strict=True):
            requests[i][0]._took(contexts[i], r)
    tokens = []
    t1 = time.perf_counter()
    for d, _ in requests:
        assert d.last_logits is not None
        tokens.append(d.backend.greedy_next(d.last_logits))
        d._count(t0, t1, 1, sharers=len(requests))
    return tokens


def expand_many(requests: Sequence[tuple[DraftCache, Sequence[Sequence[int]], int]]
                ) -> list[list[list[tuple[int, float]]]]:
    """:meth:`DraftCache.expand` for several sessions: in one forward where their backend
    expands several sessions' trees together (``expand_many``), else each in its own."""
    out: list[list[list[tuple[int, float]]] | None] = [None] * len(requests)
    index = list(range(len(requests)))
    for group in _by_backend([d for d, _, _ in requests], index):
        first = requests[group[0]][0]
        many = getattr(first.backend, "expand_many", None)
        if callable(many) and len(group) > 1 and all(
                requests[i][0].expands_in_one_forward for i in group):
            t0 = time.perf_counter()
            for i in group:
                if requests[i][0]._state is None:
                    raise RuntimeError("draft before prefill")
            results = many([(requests[i][0]._state, requests[i][1], requests[i][2])
                            for i in group])
            t1 = time.perf_counter()
            for i, r in zip(group, results, strict=True):
                out[i] = r
                requests[i][0]._count(t0, t1, 1, sharers=len(group))
        else:
            for i in group:
                d, contexts, k = requests[i]
                out[i] = d.expand(contexts, k)
    return [r for r in out if r is not None]


def _by_backend(drafters: Sequence[DraftCache], index: Sequence[int]) -> list[list[int]]:
    """``index`` grouped by the drafters' backend object, in first-seen order."""
    groups: dict[int, list[int]] = {}
    for d, i in zip(drafters, index, strict=True):
        groups.setdefault(id(d.backend), []).append(i)
    return list(groups.values())


def top_k(logits: torch.Tensor, text_vocab_size: int, k: int) -> list[tuple[int, float]]:
    """The ``k`` likeliest text tokens of one row of logits [V], with log-probabilities
    over the text vocabulary."""
    logp = torch.log_softmax(logits[..., :text_vocab_size].float(), dim=-1)  # [V_text]
    values, ids = torch.topk(logp, min(k, text_vocab_size))
    return [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
