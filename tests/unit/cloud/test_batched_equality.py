"""Batched equals alone equals HF ``generate()``: greedy fp32, through the real scheduler.

Sessions run in the real ``Scheduler`` (engine thread, one batched step per iteration)
over the real ``HFEngine``, on the tiny and the toy targets. They differ in prompt
length, draft count (0 up to the verify width) and answer length (so they finish
mid-batch), and some join while others are running. Each answer must equal HF
``generate()`` on the same inputs and the same request decoded alone.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.tickets import Failure
from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.types import DraftTail, GenerationSettings
from tests.support.alone import decode_alone

MAX_VERIFY = 9  # C[-1] plus up to 8 drafts


@dataclass(frozen=True)
class Case:
    question: str
    clip_seed: int
    max_new: int
    k: int  # drafts per step; 0 = target-only
    wrong: float  # chance a draft is wrong
    join_after: int  # join once request 0 has this many tokens (0 = at once)


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def clip(target: TargetModel, seed: int) -> torch.Tensor:
    g = target.geometry
    return torch.randn(1, g.num_frames, 3, g.image_size, g.image_size,
                       generator=torch.Generator().manual_seed(seed))


def generate(target: TargetModel, case: Case) -> list[int]:
    """Target-only greedy decoding with HF ``generate``, non-text ids suppressed."""
    ids = target.build_prompt_ids(case.question)
    model: Any = target.model
    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            pixel_values_videos=clip(target, case.clip_seed), max_new_tokens=case.max_new,
            do_sample=False, eos_token_id=target.eos_token_id, pad_token_id=target.eos_token_id,
            suppress_tokens=list(range(target.text_vocab_size, target.vocab_size)),
        )
    return [int(t) for t in out[0, len(ids):]]


def session_for(target: TargetModel, engine: HFEngine, case: Case, slot: int) -> DecodingSession:
    return DecodingSession(
        settings=GenerationSettings(max_new_tokens=case.max_new), slot=slot,
        prompt_len=len(target.build_prompt_ids(case.question)), max_seq_len=engine.max_seq_len,
        eos_token_id=target.eos_token_id, max_verify_tokens=MAX_VERIFY, decode=target.decode,
        speculative=case.k > 0,
    )


def tail_for(case: Case, truth: Sequence[int], committed: Sequence[int], rng: random.Random,
             vocab: int) -> DraftTail | None:
    """The next ``k`` tokens of the known answer, each wrong with probability ``wrong``."""
    if case.k == 0:
        return None
    base = len(committed)
    drafts = [t if rng.random() >= case.wrong else (t + 1) % vocab
              for t in truth[base : base + case.k]]
    drafts += [7] * (case.k - len(drafts))  # past the answer's end: certainly wrong
    return DraftTail(base, tuple(drafts))


async def run_together(target: TargetModel, engine: HFEngine, cases: Sequence[Case],
                       truths: Sequence[list[int]]) -> tuple[list[list[int]], Scheduler]:
    sched = Scheduler(engine, text_vocab_size=target.text_vocab_size)
    sched.start()
    progress = [0]
    moved = asyncio.Event()

    async def one(i: int, case: Case) -> list[int]:
        while progress[0] < case.join_after:
            moved.clear()
            await moved.wait()
        rng = random.Random(i)
        ticket = sched.admit(f"r{i}", lambda slot: session_for(target, engine, case, slot))
        received: list[int] = []
        hidden = tail_for(case, truths[i], received, rng, target.text_vocab_size)
        if hidden is not None:
            sched.offer(ticket, hidden)
        sched.submit_prefill(ticket, target.build_prompt_ids(case.question),
                             pixel_values_videos=clip(target, case.clip_seed))
        while True:
            event = await ticket.events.get()
            assert not isinstance(event, Failure), event.error
            received.extend(event.tokens)
            if i == 0:
                progress[0] = len(received)
                moved.set()
            if event.finish_reason is not None:
                break
            tail = tail_for(case, truths[i], received, rng, target.text_vocab_size)
            if tail is not None:
                sched.offer(ticket, tail)
        if i == 0:
            progress[0] = 10**6
            moved.set()
        sched.release(ticket)
        return received

    try:
        answers = await asyncio.gather(*(one(i, c) for i, c in enumerate(cases)))
    finally:
        await asyncio.to_thread(sched.stop)
    return list(answers), sched


QUESTIONS = ["What is moving?", "Describe the scene in a few words please.", "Is it dark?",
             "Which way does the car go, left or right, and how fast is it?"]


def tiny_cases(run: int) -> list[Case]:
    rng = random.Random(run)
    cases = []
    for i in range(8):
        cases.append(Case(
            question=QUESTIONS[(i + run) % len(QUESTIONS)],
            clip_seed=100 * run + i,
            max_new=[4, 8, 16, 24][(i + run) % 4],
            k=[0, 1, 4, MAX_VERIFY - 1][i % 4],
            wrong=[0.0, 0.3, 1.0][(i + run) % 3],
            join_after=0 if i < 4 else rng.choice([1, 3, 6]),
        ))
    return cases


@pytest.mark.parametrize("run", [0, 1, 2])
def test_tiny_target_batched_equals_alone_equals_generate(run: int) -> None:
    target = build_tiny_random_target(seed=run)
    engine = HFEngine(target, num_slots=8)
    cases = tiny_cases(run)
    truths = [generate(target, c) for c in cases]
    answers, sched = asyncio.run(run_together(target, engine, cases, truths))
    for case, truth, got in zip(cases, truths, answers, strict=True):
        assert got == truth, case
        alone = decode_alone(engine, session_for(target, engine, case, 0),
                             target.build_prompt_ids(case.question),
                             pixel_values_videos=clip(target, case.clip_seed),
                             text_vocab_size=target.text_vocab_size)
        assert alone.committed == truth, case
    assert max(sched.stats.batch_sizes) >= 4, "sessions must actually have stepped together"
    assert sched.pool.free == engine.num_slots, "a slot leaked"
    assert all(engine.cached_len(s) == 0 for s in range(engine.num_slots))


def test_toy_target_batched_equals_generate() -> None:
    from eventspec.cloud.model_dirs import TOY, model_dir
    from eventspec.cloud.target import load_target

    target = load_target(model_dir(TOY))
    engine = HFEngine(target, num_slots=4)
    cases = [Case(q, 7 + i, [6, 12, 20, 9][i], [0, 2, 8, 3][i], [0.0, 0.2, 0.0, 1.0][i],
                  [0, 0, 2, 4][i])
             for i, q in enumerate(["What is moving?", "What shape is it?",
                                    "Which way does it move?", "What color is it?"])]
    truths = [generate(target, c) for c in cases]
    answers, sched = asyncio.run(run_together(target, engine, cases, truths))
    assert answers == truths
    assert max(sched.stats.batch_sizes) >= 2
    assert sched.pool.free == engine.num_slots
