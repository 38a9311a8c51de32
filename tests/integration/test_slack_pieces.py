"""``--prefill-chunk slack`` through the real engine loop: the static engine on CPU (tiny
random target, fp32, mixed steps at fixed shapes from the slack buckets, eager), a
session decoding while two more prompts arrive. Every mixed step runs at a captured
shape, every piece that does not finish its prompt is whole tiles, the slack estimates
are fed from the loop's device times, and every answer equals the target alone
(greedy: a whole prefill then one-token steps, nothing else in the engine).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.build import build_static_engine, static_kv_plan
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.scheduling.piece_slack import SLACK_PIECE_ROWS
from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy, graphed_piece_rows
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.tickets import Ticket
from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.types import GenerationSettings
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.buckets import CHUNK_TILE
from tests.support.cloud_harness import TEST_COST
from tests.support.scheduler_sessions import answer
from tests.support.waiting import until

MAX_SEQ = 320
QUESTIONS = ("What is moving?", "How many cars cross the road from the left side?",
             "Which way does it go?")


@pytest.fixture(scope="module")
def tiny() -> TargetModel:
    return build_tiny_random_target(seed=0)


def _engine(tiny: TargetModel, policy: ChunkPolicy) -> StaticEngine:
    kv = static_kv_plan(tiny, kv_cache_bytes=None, max_seq_len=MAX_SEQ, max_slots=4)
    return build_static_engine(tiny, kv, use_graphs=False,
                               chunk_buckets=graphed_piece_rows(policy, MAX_SEQ))


def _pixels(tiny: TargetModel, seed: int) -> torch.Tensor:
    g = tiny.geometry
    return torch.randn((1, g.num_frames, 3, g.image_size, g.image_size),
                       generator=torch.Generator().manual_seed(seed))  # [1, F, 3, S, S]


def _alone(engine: StaticEngine, tiny: TargetModel, question: str, seed: int,
           max_new: int) -> list[int]:
    """The target alone: a whole prefill, then greedy one-token steps to EOS or max_new."""
    ids = tiny.build_prompt_ids(question)
    logits = engine.prefill([PrefillRequest(0, ids, pixel_values_videos=_pixels(tiny, seed))])
    vocab, out = tiny.text_vocab_size, []
    while True:
        out.append(int(logits[0, :vocab].argmax()))
        if out[-1] == tiny.eos_token_id or len(out) == max_new:
            engine.free(0)
            return out
        n = len(ids) + len(out) - 1
        logits = engine.step(StepBatch((0,), (n,), (1,), torch.tensor([out[-1]])))


def _ask(sched: Scheduler, tiny: TargetModel, name: str, question: str, seed: int,
         max_new: int) -> Ticket:
    ids = tiny.build_prompt_ids(question)

    def make(slot: int) -> DecodingSession:
        return DecodingSession(
            settings=GenerationSettings(max_new_tokens=max_new), slot=slot,
            prompt_len=len(ids), max_seq_len=MAX_SEQ, eos_token_id=tiny.eos_token_id,
            max_verify_tokens=9, decode=lambda ids: "", speculative=False)

    ticket = sched.admit(name, make)
    sched.submit_prefill(ticket, ids, pixel_values_videos=_pixels(tiny, seed))
    return ticket


@pytest.mark.parametrize("flag", ["slack", "slack:40"])
async def test_slack_pieces_are_bucket_sized_and_answers_equal_the_target_alone(
        tiny: TargetModel, flag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = ChunkPolicy.parse(flag)
    engine = _engine(tiny, policy)
    assert engine.chunk_buckets == tuple(r for r in SLACK_PIECE_ROWS if r <= MAX_SEQ)
    # The first request's answer runs long (it decodes while the others prefill).
    seeds = range(6)
    first_seed = max(seeds, key=lambda s: len(_alone(engine, tiny, QUESTIONS[0], s, 60)))
    asks = [(QUESTIONS[0], first_seed, 60), (QUESTIONS[1], 7, 12), (QUESTIONS[2], 8, 12)]
    want = [_alone(engine, tiny, q, s, n) for q, s, n in asks]
    assert len(want[0]) == 60, "no seed gives the first request a long answer"

    mixed: list[list[tuple[int, int]]] = []  # each mixed step's pieces: (start, rows)
    fixed: list[int] = []  # rows of each mixed step run at a fixed shape
    real_mixed, real_forward = engine.step_with_chunks, engine._forward_mixed

    def spy_mixed(batch: StepBatch, chunks: Any) -> Any:
        mixed.append([(c.start, int(c.embeds.shape[0])) for c in chunks])
        return real_mixed(batch, chunks)

    def spy_forward(*args: Any) -> torch.Tensor:
        fixed.append(args[1].rows)
        return real_forward(*args)

    monkeypatch.setattr(engine, "step_with_chunks", spy_mixed)
    monkeypatch.setattr(engine, "_forward_mixed", spy_forward)
    sched = Scheduler(engine, text_vocab_size=tiny.text_vocab_size, prefill_chunk=policy,
                      chunk_cost=TEST_COST)
    assert sched.mixed_steps and sched.plans.slack is not None
    row_seed = sched.plans.slack.times.row_ms
    sched.start()
    try:
        first = _ask(sched, tiny, "first", *asks[0])
        await until(lambda: first.session.prefilled, "the first request decodes")
        rest = [_ask(sched, tiny, f"r{i}", *a) for i, a in enumerate(asks[1:], 1)]
        got = await asyncio.gather(*(answer(t) for t in [first, *rest]))
    finally:
        await asyncio.to_thread(sched.stop)
    assert got == want
    assert mixed, "the later prompts rode the first one's steps"
    assert len(fixed) == len(mixed), "a mixed step ran at exact shapes, not a captured one"
    assert set(fixed) <= set(engine.chunk_buckets)
    lengths = {len(tiny.build_prompt_ids(q)) for q, _, _ in asks[1:]}
    for pieces in mixed:
        for start, rows in pieces:
            assert start + rows in lengths or rows % CHUNK_TILE == 0, pieces
    # The loop's device times reached the estimates: rows are priced as measured.
    assert sched.plans.slack.times.row_ms != row_seed
