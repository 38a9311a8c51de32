"""Positions per KV slot: ``--max-seq-len`` when given, else the prompt plus room for a
question and the answer cap, never more than the model has; the prefix cache's budget
comes out of the KV budget."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from eventspec.cloud.config import CloudSettings
from eventspec.cloud.engine.kv import AUTO_QUESTION_TOKENS, GIB, auto_max_seq_len, plan_kv
from eventspec.cloud.server import slot_positions
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.types import ServerLimits


@pytest.fixture(scope="module")
def tiny() -> TargetModel:
    return build_tiny_random_target(seed=0)


@given(base=st.integers(1, 5000), cap=st.integers(1, 4096), model=st.integers(2, 8192))
def test_auto_holds_prompt_question_and_answer_within_the_model(base: int, cap: int,
                                                                model: int) -> None:
    n = auto_max_seq_len(base, cap, model)
    assert n == min(model, base + AUTO_QUESTION_TOKENS + cap)


def test_the_full_size_prompt_gets_a_slot_cut_to_it() -> None:
    """Video-LLaVA-7B's 2,103-token prompt with a 15-token question: 2,088 positions of
    template and video, so 2,088 + 256 + 512 = 2,856 instead of 4,096 (1.43x the slots)."""
    assert auto_max_seq_len(2088, 512, 4096) == 2856
    assert 4096 / 2856 > 1.4


def test_an_explicit_flag_wins_and_the_model_bounds_it(tiny: TargetModel) -> None:
    base = len(tiny.build_prompt_ids(""))
    default = CloudSettings()
    assert slot_positions(default, tiny) == base + AUTO_QUESTION_TOKENS + 512
    assert slot_positions(replace(default, limits=replace(ServerLimits(), max_new_tokens=64)),
                          tiny) == base + AUTO_QUESTION_TOKENS + 64
    assert slot_positions(replace(default, max_seq_len=300), tiny) == 300
    assert slot_positions(replace(default, max_seq_len=10**6), tiny) == tiny.max_positions


def test_the_prefix_cache_budget_comes_out_of_free_memory_only() -> None:
    """With --kv-cache-gb the operator sized KV themselves; the reserve applies to the
    budget drawn from free device memory (CUDA), never to an explicit one."""
    cpu = torch.device("cpu")
    explicit = plan_kv(bytes_per_token=1024, max_seq_len=1024, device=cpu, kv_cache_gb=1.0,
                       memory_fraction=0.9, max_slots=10**6, reserved_bytes=GIB // 2)
    assert explicit.budget_bytes == GIB


def test_kv_by_length_takes_the_budget_up_to_what_the_sessions_could_use() -> None:
    """The arena is the budget's positions less one request of padding scratch, capped
    at --max-sessions requests of the longest length (a toy on an 80 GB card reserved
    70 GB for four sessions before the cap); too small a budget names the flags."""
    from eventspec.cloud.engine.kv import fit_arena

    plan = fit_arena(1000 * 10, "test", bytes_per_token=10, max_seq_len=100, max_sessions=64)
    assert (plan.arena_positions, plan.num_slots) == (900, 64)
    capped = fit_arena(10**9, "test", bytes_per_token=10, max_seq_len=100, max_sessions=4)
    assert capped.arena_positions == 400
    assert "KV by length: an arena of 400 positions" in capped.describe()
    with pytest.raises(InvalidInput, match="raise --kv-cache-gb or lower --max-seq-len"):
        fit_arena(150 * 10, "test", bytes_per_token=10, max_seq_len=100, max_sessions=4)
