"""All of an edge's sessions drafting in one forward (issue 36, ``edge/drafting/batcher.py``):
requests that wait while a forward runs go together in the next; each gets its own
answer; a failure reaches the requests of its forward only; the oracle drafts the same
tokens batched as alone."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from eventspec.edge.drafting.batcher import DraftBatcher
from eventspec.edge.drafting.cache import DraftCache, draft_many, expand_many
from eventspec.edge.drafting.oracle_backend import OracleDraftBackend, OracleSettings
from eventspec.edge.worker import ModelWorker

V, EOS = 64, 2
#: Bound on any wait for the worker thread (the CI machine is busy; never reached).
WAIT_S = 30.0


@dataclass
class _State:
    base: int  # this session's tokens are base, base + 1, ... (mod V)
    fed: int = 0


class CountingBackend:
    """A draft backend whose next token is a function of the session and position, that
    records each forward's width and can hold the first forward until released."""

    text_vocab_size, eos_token_id = V, EOS

    def __init__(self, *, hold_first: bool = False, fail_width: int = 0) -> None:
        self.widths: list[int] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not hold_first:
            self.release.set()
        self.fail_width = fail_width

    def _row(self, state: _State, position: int) -> torch.Tensor:
        row = torch.zeros(V)
        row[(state.base + position) % (V - 3) + 3] = 1.0
        return row

    def prefill(self, question: str, pixel_values: torch.Tensor | None, *,
                clip_features: torch.Tensor | None = None) -> tuple[_State, torch.Tensor]:
        state = _State(base=len(question))
        return state, self._row(state, 0)

    def step(self, state: _State, tokens: Sequence[int]) -> torch.Tensor:
        return self.step_many([(state, tokens)])[0]

    def step_many(self, items: Sequence[tuple[_State, Sequence[int]]]) -> list[torch.Tensor]:
        self.entered.set()
        assert self.release.wait(WAIT_S), "never released"
        self.widths.append(len(items))
        if len(items) == self.fail_width:
            raise RuntimeError("device lost")
        out = []
        for state, tokens in items:
            out.append(torch.stack([self._row(state, state.fed + j + 1)
                                    for j in range(len(tokens))]))
            state.fed += len(tokens)
        return out

    def rollback(self, state: _State, keep_len: int) -> None:
        state.fed = keep_len

    def seq_len(self, state: _State) -> int:
        return state.fed

    def greedy_next(self, logits_row: torch.Tensor) -> int:
        return int(torch.argmax(logits_row))


def _drafters(backend: Any, n: int) -> list[DraftCache]:
    out = []
    for i in range(n):
        d = DraftCache(backend)
        d.prefill("q" * (i + 1), None)  # type: ignore[arg-type]
        out.append(d)
    return out


async def test_requests_waiting_on_a_forward_go_together_in_the_next() -> None:
    backend = CountingBackend(hold_first=True)
    drafters = _drafters(backend, 4)
    worker = ModelWorker("test-drafting")
    batcher = DraftBatcher(worker)
    try:
        first = asyncio.ensure_future(batcher.draft(drafters[0], [5]))
        assert await asyncio.to_thread(backend.entered.wait, WAIT_S)  # forward 1 runs
        rest = [asyncio.ensure_future(batcher.draft(d, [5, 6])) for d in drafters[1:]]
        await asyncio.sleep(0)  # let them queue behind it
        backend.release.set()
        tokens = await asyncio.wait_for(asyncio.gather(first, *rest), WAIT_S)
    finally:
        worker.shutdown()
    assert backend.widths == [1, 3]
    assert batcher.stats.sizes == {1: 1, 3: 1} and batcher.stats.largest == 3
    alone = [DraftCache(CountingBackend()) for _ in range(4)]
    for i, d in enumerate(alone):
        d.prefill("q" * (i + 1), None)  # type: ignore[arg-type]
    assert tokens == [alone[0].draft_next([5]), *(d.draft_next([5, 6]) for d in alone[1:])]


async def test_a_request_that_ended_while_it_waited_is_not_drafted() -> None:
    backend = CountingBackend(hold_first=True)
    drafters = _drafters(backend, 3)
    worker = ModelWorker("test-drafting")
    batcher = DraftBatcher(worker)
    try:
        first = asyncio.ensure_future(batcher.draft(drafters[0], [5]))
        assert await asyncio.to_thread(backend.entered.wait, WAIT_S)
        gone = asyncio.ensure_future(batcher.draft(drafters[1], [6]))
        kept = asyncio.ensure_future(batcher.draft(drafters[2], [6]))
        await asyncio.sleep(0)  # both queue behind the first forward
        gone.cancel()
        backend.release.set()
        await asyncio.wait_for(asyncio.gather(first, kept), WAIT_S)
    finally:
        worker.shutdown()
    assert backend.widths == [1, 1]  # the cancelled request took no place in a forward


async def test_a_failed_forward_fails_its_requests_and_the_next_one_runs() -> None:
    backend = CountingBackend(hold_first=True, fail_width=2)
    drafters = _drafters(backend, 4)
    worker = ModelWorker("test-drafting")
    batcher = DraftBatcher(worker)
    try:
        first = asyncio.ensure_future(batcher.draft(drafters[0], [5]))
        assert await asyncio.to_thread(backend.entered.wait, WAIT_S)
        doomed = [asyncio.ensure_future(batcher.draft(d, [7])) for d in drafters[1:3]]
        await asyncio.sleep(0)
        backend.release.set()
        assert isinstance(await asyncio.wait_for(first, WAIT_S), int)
        for f in doomed:
            with pytest.raises(RuntimeError, match="device lost"):
                await asyncio.wait_for(f, WAIT_S)
        later = await asyncio.wait_for(batcher.draft(drafters[3], [9]), WAIT_S)
    finally:
        worker.shutdown()
    assert backend.widths == [1, 2, 1] and isinstance(later, int)


def _oracle(coverage: float = 0.0) -> OracleDraftBackend:
    answers = {f"q{i}": tuple(10 + (7 * i + 3 * p) % 40 for p in range(30)) for i in range(4)}
    return OracleDraftBackend(OracleSettings(answers, 0.7, 0.0, 0.0, 1, coverage), V, EOS)


def test_the_oracle_drafts_the_same_tokens_batched_and_alone() -> None:
    batched, alone = _oracle(), _oracle()
    calls: list[int] = []
    many = batched.step_many
    batched.step_many = lambda items: (calls.append(len(items)), many(items))[1]  # type: ignore[method-assign]
    mine = [DraftCache(batched) for _ in range(4)]
    theirs = [DraftCache(alone) for _ in range(4)]
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        a.prefill(f"q{i}", None)  # type: ignore[arg-type]
        b.prefill(f"q{i}", None)  # type: ignore[arg-type]
    contexts: list[list[int]] = [[], [], [], []]
    for _ in range(6):
        got = draft_many([(d, list(c)) for d, c in zip(mine, contexts, strict=True)])
        want = [d.draft_next(c) for d, c in zip(theirs, contexts, strict=True)]
        assert got == want
        for c, t in zip(contexts, got, strict=True):
            c.append(t)
    assert calls and all(n == 4 for n in calls)


def test_the_oracle_expands_several_trees_in_one_forward() -> None:
    batched, alone = _oracle(0.75), _oracle(0.75)
    calls: list[int] = []
    many = batched.expand_many
    batched.expand_many = lambda items: (calls.append(len(items)), many(items))[1]  # type: ignore[method-assign]
    mine, theirs = [DraftCache(batched) for _ in range(3)], [DraftCache(alone) for _ in range(3)]
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        a.prefill(f"q{i}", None)  # type: ignore[arg-type]
        b.prefill(f"q{i}", None)  # type: ignore[arg-type]
    contexts = [[[]], [[], [11]], [[12, 13]]]
    got = expand_many([(d, c, 4) for d, c in zip(mine, contexts, strict=True)])
    assert got == [d.expand(c, 4) for d, c in zip(theirs, contexts, strict=True)]
    assert calls == [3]


def test_a_shared_forward_counts_once_in_the_edges_busy_time() -> None:
    """Four sessions in one forward: each waited the whole forward (its latency, which
    the plan prices), but the edge was busy once, so the sessions' busy shares add up to
    the forward's time, not four times it (the capacity JSONs' ``draft_ms_per_step``)."""
    backend = _oracle()
    mine = [DraftCache(backend) for _ in range(4)]
    for i, d in enumerate(mine):
        d.prefill(f"q{i}", None)  # type: ignore[arg-type]
    draft_many([(d, []) for d in mine])
    waited = [d.draft_ms_total for d in mine]
    assert all(w == waited[0] for w in waited) and waited[0] > 0
    busy = [d.draft_busy_ms for d in mine]
    assert sum(busy) == pytest.approx(waited[0])
    alone = DraftCache(_oracle())
    alone.prefill("q0", None)  # type: ignore[arg-type]
    alone.draft_next([])
    assert alone.draft_busy_ms == alone.draft_ms_total > 0
