"""The static engine with KV by length (an arena seen through a strided view, slot =
a run's first position) against the HF reference on CPU, fp32: sessions packed in
adjacent runs of their own lengths give the same logits and greedy tokens as HF, so no
session reads or writes its neighbour's positions; nothing runs past its run."""

from __future__ import annotations

import pytest
import torch

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.scheduling.kv_arena import PositionArena
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.batch import StepBatch
from tests.unit.cloud.test_static_engine import QUESTIONS, clip, run_speculative

ROUNDS, MAX_COUNT = 8, 5


@pytest.fixture(scope="module")
def tiny() -> TargetModel:
    return build_tiny_random_target(seed=0)


def arena_engine(target: TargetModel, positions: int) -> StaticEngine:
    return StaticEngine(target, num_slots=4, max_seq_len=256, use_graphs=False,
                        compile_layers=False, kv_positions=positions)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_runs_match_hf(tiny: TargetModel, seed: int) -> None:
    """Four sessions in back-to-back runs cut to prompt + what the test can write; the
    runs start at odd places (a run of 7 + seed positions in front)."""
    room = ROUNDS * MAX_COUNT + 1  # the most a session advances, plus its first token
    needs = [len(tiny.build_prompt_ids(q)) + room for q in QUESTIONS]
    arena = PositionArena(7 + seed + sum(needs))
    offset = arena.allocate(7 + seed)
    slots = [arena.allocate(n) for n in needs]
    assert offset == 0 and None not in slots
    engine = arena_engine(tiny, arena.size)
    for s, n in zip(slots, needs, strict=True):
        assert s is not None
        engine.reserve(s, n)
    run_speculative(tiny, engine, [s for s in slots if s is not None], list(QUESTIONS),
                    rounds=ROUNDS, seed=seed, max_count=MAX_COUNT)


def test_nothing_runs_past_its_run(tiny: TargetModel) -> None:
    ids = tiny.build_prompt_ids(QUESTIONS[0])
    engine = arena_engine(tiny, 3 * len(ids))
    req = PrefillRequest(slot=5, input_ids=ids, pixel_values_videos=clip(tiny, 0))
    with pytest.raises(InvalidInput, match="does not fit a slot of 0"):
        engine.prefill([req])  # no run reserved at 5: nothing may be written there
    with pytest.raises(InvalidInput, match="passes the arena's end"):
        engine.reserve(2 * len(ids), len(ids) + 1)
    with pytest.raises(InvalidInput, match="outside 0"):
        engine.reserve(3 * len(ids), 1)  # the scratch window is not the sessions'
    engine.reserve(5, len(ids) + 2)
    engine.prefill([req])
    step = StepBatch(slots=(5,), start_positions=(len(ids),), counts=(3,),
                     token_ids=torch.tensor([1, 2, 3]))
    with pytest.raises(InvalidInput, match=r"tokens \[\d+, \d+\) outside"):
        engine.step(step)  # 3 tokens from the prompt's end pass the run by one
    engine.step(StepBatch(slots=(5,), start_positions=(len(ids),), counts=(2,),
                          token_ids=torch.tensor([1, 2])))
    engine.free(5)
    with pytest.raises(InvalidInput, match="holds no prefilled session"):
        engine.step(step)
