"""All of an edge's drafting sessions in one forward: requests that wait while the model
is busy go together in the next one.

Why: the edge ran one draft forward per session at a time on its single model thread,
so with 4 sessions on an edge each got a draft token every 4 forwards, fewer than the
cloud's steps needed (issue 36, cause 3: at 64 clients on 16 edges a session drafted
once per 13.6 ms). A memory-bound drafter reads its weights once per forward whether it
feeds one session's token or four, so the sessions' next tokens go in one batched
forward on the shared static runtime (``StaticDraftBackend.step_many``; the oracle
paces it once), as the cloud's scheduler steps all its sessions together.

The rhythm is continuous batching: while a forward runs, new requests wait in a list;
when it ends, the whole list goes in the next one, on the same model thread as the
prefills (``ModelWorker``, first in first out), so nothing starves. One session at a
time costs what it did (the same single-session call).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from eventspec.edge.drafting.cache import DraftCache, draft_many, expand_many
from eventspec.edge.worker import ModelWorker

__all__ = ["BatchStats", "DraftBatcher"]

Children = list[list[tuple[int, float]]]


@dataclass
class _Request:
    drafter: DraftCache
    contexts: Sequence[Sequence[int]]  # one context (a chain's next token) or a tree's
    k: int  # top-k children for trees; 0: the greedy token after ``contexts[0]``
    future: asyncio.Future[Any]


@dataclass
class BatchStats:
    """How much drafting went together (``eventspec status``, benchmarks)."""

    forwards: int = 0
    requests: int = 0
    largest: int = 0
    sizes: dict[int, int] = field(default_factory=dict)

    def add(self, size: int) -> None:
        self.forwards += 1
        self.requests += size
        self.largest = max(self.largest, size)
        self.sizes[size] = self.sizes.get(size, 0) + 1


class DraftBatcher:
    """The edge's draft forwards, batched across its sessions on one ``ModelWorker``."""

    def __init__(self, worker: ModelWorker) -> None:
        self.worker = worker
        self._waiting: list[_Request] = []
        self._running = False
        self.stats = BatchStats()

    async def draft(self, drafter: DraftCache, context: Sequence[int]) -> int:
        """The greedy token after ``prompt + context`` (``DraftCache.draft_next``)."""
        result: int = await self._submit(drafter, (context,), 0)
        return result

    async def expand(self, drafter: DraftCache, contexts: Sequence[Sequence[int]],
                     k: int) -> Children:
        """Top-``k`` children after each context (``DraftCache.expand``)."""
        result: Children = await self._submit(drafter, contexts, max(1, k))
        return result

    def _submit(self, drafter: DraftCache, contexts: Sequence[Sequence[int]],
                k: int) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Request(drafter, contexts, k, future))
        if not self._running:
            self._start()
        return future

    def _start(self) -> None:
        # A request whose Ask ended while it waited costs no model work.
        batch = [r for r in self._waiting if not r.future.done()]
        self._waiting = []
        if not batch:
            return
        self._running = True
        self.stats.add(len(batch))
        job = asyncio.ensure_future(self.worker.run(lambda: _run(batch)))
        job.add_done_callback(lambda done: self._finish(done, batch))

    def _finish(self, job: asyncio.Future[list[Any]], batch: list[_Request]) -> None:
        self._running = False
        if job.cancelled():
            for r in batch:
                r.future.cancel()
        elif (error := job.exception()) is not None:
            for r in batch:
                if not r.future.done():
                    r.future.set_exception(error)
        else:
            for r, result in zip(batch, job.result(), strict=True):
                if r.future.done():  # its request ended meanwhile
                    continue
                if isinstance(result, BaseException):
                    r.future.set_exception(result)
                else:
                    r.future.set_result(result)
        if self._waiting:
            self._start()


def _run(batch: Sequence[_Request]) -> list[Any]:
    """On the model thread: every chain request in one ``draft_many``, every tree request
    in one ``expand_many``; a failure fails the requests of its call only."""
    out: list[Any] = [None] * len(batch)
    chains = [i for i, r in enumerate(batch) if r.k == 0]
    trees = [i for i, r in enumerate(batch) if r.k > 0]
    for index, call in ((chains, _chains), (trees, _trees)):
        if not index:
            continue
        try:
            results = call([batch[i] for i in index])
        except Exception as exc:
            results = [exc] * len(index)
        for i, result in zip(index, results, strict=True):
            out[i] = result
    return out


def _chains(requests: Sequence[_Request]) -> list[Any]:
    if _repeats_a_drafter(requests):  # one cache cannot follow two contexts at once
        return [draft_many([(r.drafter, r.contexts[0])])[0] for r in requests]
    return list(draft_many([(r.drafter, r.contexts[0]) for r in requests]))


def _trees(requests: Sequence[_Request]) -> list[Any]:
    if _repeats_a_drafter(requests):
        return [expand_many([(r.drafter, r.contexts, r.k)])[0] for r in requests]
    return list(expand_many([(r.drafter, r.contexts, r.k) for r in requests]))


def _repeats_a_drafter(requests: Sequence[_Request]) -> bool:
    return len({id(r.drafter) for r in requests}) < len(requests)
