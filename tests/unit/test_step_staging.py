"""The static step's index staging (``shared/node/static/staging.py``) on the CPU.

On CUDA the index block is written into a kept pinned block that still holds an
earlier step's arrays (``StepStaging._load_pinned``); the arrays the step reads must
then be the same as a fresh, zeroed block's. Checked here on the host, for many
batches, with a stale block full of junk."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.shared.node.static.buckets import MetaLayout
from eventspec.shared.node.static.staging import StepStaging

CAP_B, CAP_Q, MAX_SEQ = 8, 9, 64


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], int, int]:
    b = draw(st.integers(1, CAP_B))
    slots = draw(st.lists(st.integers(0, 20), min_size=b, max_size=b, unique=True))
    counts = draw(st.lists(st.integers(1, CAP_Q), min_size=b, max_size=b))
    starts = [draw(st.integers(1, MAX_SEQ - c)) for c in counts]
    bp = draw(st.integers(b, CAP_B))
    qp = draw(st.integers(max(counts), CAP_Q))
    return slots, starts, counts, bp, qp


@settings(max_examples=60, deadline=None)
@given(batch=batches(), junk=st.integers(-(2**40), 2**40))
def test_a_reused_block_gives_the_step_what_a_fresh_one_does(
        batch: tuple[list[int], list[int], list[int], int, int], junk: int) -> None:
    slots, starts, counts, bp, qp = batch
    staging = StepStaging(torch.device("cpu"), max_seq_len=MAX_SEQ, scratch_slot=99,
                          cap_m=CAP_B * CAP_Q, cap_b=CAP_B)
    layout: MetaLayout = staging.layout
    fresh, dest = staging.host_meta(layout, slots, starts, counts, bp, qp)
    stale = np.full(layout.size + layout.cap_m, junk, dtype=np.int64)  # the kept block
    reused, dest_reused = staging.host_meta(layout, slots, starts, counts, bp, qp, out=stale)
    assert np.array_equal(dest, dest_reused)
    for want, got in zip(layout.views(torch.from_numpy(fresh), bp, qp),
                         layout.views(torch.from_numpy(reused), bp, qp), strict=True):
        assert torch.equal(want, got)
    assert len(dest) == sum(counts)
