"""A whole prompt's attention at a rounded length equals it at its own length.

The static runtime runs a prompt's causal attention padded to a multiple of
``PROMPT_LENGTH_STEP`` rows, so an attention backend that plans per shape (cuDNN on
Hopper) meets a bounded set of shapes. Padding must never change a real row: the
padded queries are zeros appended after the prompt, the padded keys are whatever the
slot holds after it (here: large random values, and NaN-free garbage from another
"session"), and causality hides both from every real row.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.shared.node.static.pieces import (
    PROMPT_LENGTH_STEP,
    lay_out,
    padded_length,
    plan_prompt_attention,
    sdpa_piece_attention,
)

HQ, HKV, D = 4, 2, 8


@given(n=st.integers(1, 5000), limit=st.integers(1, 5000), step=st.integers(1, 300))
def test_the_rounded_length_is_a_multiple_within_the_limit(n: int, limit: int,
                                                           step: int) -> None:
    p = padded_length(n, limit, step)
    assert p >= n
    assert p == n or p <= limit
    assert p % step == 0 or p in (limit, n)
    assert p - n < step


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 70), min_size=1, max_size=3),
       starts=st.lists(st.integers(0, 20), min_size=3, max_size=3),
       step=st.sampled_from([1, 8, 16, 128]), seed=st.integers(0, 2**16))
def test_padded_prompt_attention_equals_the_unpadded(lengths: list[int], starts: list[int],
                                                     step: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    slots, t = [0, 1, 2][: len(lengths)], 96
    k_cache = 50 * torch.randn(4, HKV, t, D, generator=g)  # [S, Hkv, T, D]: garbage beyond
    v_cache = 50 * torch.randn(4, HKV, t, D, generator=g)
    begin = [s if i % 2 else 0 for i, s in enumerate(starts[: len(lengths)])]
    embeds = [torch.zeros(n, 1) for n in lengths]
    pieces = lay_out(slots, embeds, begin, torch.float32, torch.device("cpu"))
    q = torch.randn(sum(lengths), HQ * D, generator=g)  # [M, Hq D]
    padded = sdpa_piece_attention(q, k_cache, v_cache, pieces, HQ, length_step=step)
    exact = sdpa_piece_attention(q, k_cache, v_cache, pieces, HQ, length_step=1)
    assert padded.shape == (sum(lengths), HQ * D)
    # fp32; V is 50 x randn, so outputs reach ~50: rounding differs by block order, while
    # a leaked padding key moved a row by about 250 in a check by hand.
    torch.testing.assert_close(padded, exact, rtol=1e-4, atol=1e-2)


def test_planning_runs_every_rounded_length_once() -> None:
    k = torch.zeros(HKV, 300, D)  # one slot of 300 positions
    assert plan_prompt_attention(k, k.clone(), HQ, length_step=128) == 3  # 128, 256, 300
    assert plan_prompt_attention(k, k.clone(), HQ, length_step=100) == 3  # 100, 200, 300
    assert PROMPT_LENGTH_STEP == 128
