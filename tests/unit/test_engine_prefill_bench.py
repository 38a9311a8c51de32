"""``benchmarks/engine_prefill.py`` (``bench_engine --prefill-only``) on CPU with the tiny
target: the same calls the GPU run makes, each part timed in both modes, the README's
rows built from the result, and the engine left holding what the runs wrote."""

from __future__ import annotations

import pytest

from benchmarks.engine_agreement import QUESTION, pixels
from benchmarks.engine_prefill import mixed_costs, prefill_costs
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from tests.support.tools import load_tool

#: The docs' table kinds (``tools/results_tables.py``), which render these results.
TABLES = load_tool("results_tables")

Built = tuple[StaticEngine, TargetModel]


@pytest.fixture(scope="module")
def built() -> Built:
    target = build_tiny_random_target(seed=0)
    engine = StaticEngine(target, num_slots=8, max_seq_len=512, use_graphs=False,
                          compile_layers=False, chunk_buckets=(64,))
    return engine, target


def test_the_prefill_parts_are_timed_in_both_modes(built: Built) -> None:
    engine, target = built
    out = prefill_costs(engine, target, repeats=2)
    for part in ("prefill_ms", "tower_ms", "question_after_prefix_ms"):
        assert out[f"{part}_eager"] > 0 and out[f"{part}_graphed"] > 0
    for part in ("new_length_first_ms", "new_length_again_ms"):
        assert len(out[f"{part}_eager"]) == len(out[f"{part}_graphed"]) == 3
    # The question reran on the same prefix each time: the slot ends after it.
    assert engine.occupancy.filled(0) == out["prompt_tokens"] + out["question_tokens"]
    assert engine.prompt_length_step > 1  # the graphed mode's setting is put back
    rows = TABLES.prefill_parts([("cpu", out)])[2:]  # past the header and its rule
    assert len(rows) == 5 and all(r.startswith("| ") and r.count("|") == 4 for r in rows)


def test_a_mixed_step_is_timed_against_the_step_and_the_piece_apart(built: Built) -> None:
    engine, target = built
    engine.prefill([PrefillRequest(slot=0, input_ids=target.build_prompt_ids(QUESTION),
                                   pixel_values_videos=pixels(target, 0))])
    out = mixed_costs(engine, ctx=100, repeats=2, sessions=(1, 4), rows=64)
    for b in (1, 4):
        for what in ("step", "mixed_graphed", "mixed_eager", "apart"):
            assert out[f"B{b}_{what}_ms"] > 0
    piece_slot = 5  # max(sessions) + 1
    assert engine.occupancy.filled(piece_slot) == min(1024, engine.max_seq_len - 64 - 2) + 64
    assert engine.occupancy.is_live(3)  # fill_slots made slots 1..4 sessions
    assert len(TABLES.mixed_steps([("cpu", {"mixed_step": out})])[2:]) == 2

