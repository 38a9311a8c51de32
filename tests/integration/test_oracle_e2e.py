"""The oracle drafter through a real edge and a paced toy cloud: greedy speculative output
is token-identical to target-only whatever the drafts (α = 0, 0.5, 1; chains, and trees
of q = 0.75 grown by the edge), and the edge reports the oracle's label and, for trees,
the nodes it sent and pruned."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.paced import PacedEngine
from eventspec.cloud.server import VerifierServer
from eventspec.edge.config import EdgeSettings
from eventspec.edge.drafting.oracle_backend import BENCHMARKS_ONLY
from eventspec.edge.events.toy import ToySource
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.contract.types import FinalEvent, Mode
from tests.support import cloud_harness as ch
from tests.support.edge_harness import ask, slow_cost, toy_target

QUESTIONS = ["Which way is the object moving?", "How many objects are there?",
             "What shape is the object?"]
MAX_NEW = 12


@dataclass
class OracleWorld:
    """A paced toy cloud, the target-only answers to QUESTIONS (asked through an oracle
    edge that knows none yet, as the benchmark precomputes them), and a way to start
    oracle edges that draft them."""

    base: EdgeSettings
    answers: Path
    truth: dict[str, FinalEvent]
    edges: list[EdgeServer]

    async def edge(self, alpha: float, coverage: float) -> str:
        edge = EdgeServer(replace(self.base, draft_engine="oracle", oracle_answers=self.answers,
                                  oracle_alpha=alpha, oracle_ms_per_token=2.0,
                                  oracle_prefill_ms=20.0, oracle_coverage=coverage),
                          source=ToySource([0]))
        self.edges.append(edge)
        await edge.start()
        return f"127.0.0.1:{edge.port}"


@contextlib.asynccontextmanager
async def oracle_world(tmp_path: Path) -> AsyncIterator[OracleWorld]:
    target = toy_target()
    engine = PacedEngine(HFEngine(target), prefill_ms=300, step_ms=30)
    cloud = VerifierServer(ch.settings(max_sessions=4), target=target, engine=engine,
                           cost=slow_cost(0.3, 0.03))
    await cloud.start()
    base = replace(EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0, model="toy",
                   speculation="always", profile_path=tmp_path / "edge.msgpack")
    answers = tmp_path / "answers.json"
    answers.write_text("{}")
    world = OracleWorld(base, answers, {}, [])
    try:
        first = EdgeServer(replace(base, draft_engine="oracle", oracle_answers=answers),
                           source=ToySource([0]))
        world.edges.append(first)
        await first.start()
        address = f"127.0.0.1:{first.port}"
        world.truth = {q: await ask(address, q, Mode.TARGET_ONLY, max_new=MAX_NEW)
                       for q in QUESTIONS}
        answers.write_text(json.dumps({q: list(f.token_ids) for q, f in world.truth.items()}))
        yield world
    finally:
        for edge in world.edges:
            await edge.stop(0)
        await cloud.stop(0)


async def test_speculation_with_the_oracle_is_lossless_at_any_alpha(tmp_path: Path) -> None:
    async with oracle_world(tmp_path) as world:
        truth = world.truth
        for alpha, q in ((0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (0.5, 0.75)):
            address = await world.edge(alpha, q)
            async with EdgeClient(address, timeout_s=30) as client:
                status = await client.status()
            assert status.draft_engine.startswith(f"oracle α={alpha:g}"), status.draft_engine
            assert BENCHMARKS_ONLY in status.draft_engine
            drafted = accepted = nodes = offered = 0
            for question in QUESTIONS:
                spec = await ask(address, question, Mode.SPECULATIVE, max_new=MAX_NEW)
                assert spec.token_ids == truth[question].token_ids, (alpha, q, spec.stats)
                assert spec.answer == truth[question].answer
                drafted += spec.stats.drafted
                accepted += spec.stats.accepted
                nodes += spec.stats.tree_nodes_sent
                offered += spec.stats.drafts_on_offer
            assert drafted > 0 and offered >= drafted - 3 * len(QUESTIONS), alpha
            assert (nodes > 0) == (q > 0), (alpha, q, nodes)
            if alpha == 0.0:
                assert accepted == 0
            if alpha == 1.0:
                assert accepted == drafted, (accepted, drafted)


async def test_an_edges_sessions_draft_together_and_stay_lossless(tmp_path: Path) -> None:
    """Three Asks at once on one edge (issue 36): the cloud commits to all of them in the
    same steps, so their next drafts are wanted together and go in one forward; chains
    and trees alike, every answer is still target-only's."""
    async with oracle_world(tmp_path) as world:
        for q in (0.0, 0.75):
            address = await world.edge(0.5, q)
            finals = await asyncio.gather(*(ask(address, question, Mode.SPECULATIVE,
                                                max_new=MAX_NEW) for question in QUESTIONS))
            for question, final in zip(QUESTIONS, finals, strict=True):
                assert final.token_ids == world.truth[question].token_ids, (q, final.stats)
            batcher = world.edges[-1].agent.drafting
            assert batcher.stats.largest >= 2, batcher.stats
