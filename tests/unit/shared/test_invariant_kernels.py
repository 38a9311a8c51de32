"""The host-side rules of the batch-invariant Triton kernels, on CPU (no Triton needed):
the GEMM's tile depends on the weight's shape and never on the number of rows, the
attention's compiled arguments never on B or Q, and a prompt piece's 16-query
pseudo-sessions give every query the (start, seq_len) a verify step of it would have.
The kernels themselves run in ``tests/gpu/test_batch_invariant_cuda.py``."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.invariant_tiles import (
    ATTN_BLOCK_N,
    MM_CONFIGS,
    QUERY_TILE,
    SPLIT,
    attention_launch,
    group_pseudo_sessions,
    mm_config,
    mm_launch,
    num_splits_for_slot,
    prefill_layout,
    prefill_pseudo_sessions,
    prefill_tiles,
)

#: (N, K) of a LLaMA-7B / Video-LLaVA-7B layer's fused QKV, wo, fused gate-up, down, and
#: the two LM heads.
SHAPES_7B = [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008), (32000, 4096),
             (32064, 4096)]
ROWS = [1, 4, 9, 16, 144, 576, 2100, 2112]


@pytest.mark.parametrize(("n", "k"), SHAPES_7B)
def test_every_7b_shape_has_its_own_tiles_all_of_one_mma_family(n: int, k: int) -> None:
    buckets = MM_CONFIGS[(n, k)]
    bounds = [last for last, _ in buckets]
    assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds)
    assert bounds[-1] >= 1 << 40, "the last bucket takes any M"
    for m in ROWS:
        c = mm_config(n, k, m)
        assert c is next(cfg for last, cfg in buckets if m <= last)
        for block in (c.block_m, c.block_n, c.block_k):
            assert block >= 16 and block & (block - 1) == 0, c
        assert k % c.block_k == 0, "K is walked in whole chunks"
        # The one condition under which a row's bits do not depend on the tile:
        # every tile a wgmma tile (the module docstring of invariant_kernels).
        assert c.block_m % 64 == 0 and c.num_warps % 4 == 0, c
        if c.persistent:  # TMA boxes: at most 256 elements a side, rows of 16-byte units
            assert max(c.block_m, c.block_n, c.block_k) <= 256 and c.block_k * 2 % 16 == 0
    decode = mm_config(n, k, 1)
    assert -(-n // decode.block_n) >= 128, "a decode step needs column stripes for every SM"
    assert not decode.persistent, "decode steps keep the pointer-fed tiles (faster at M <= 64)"


@pytest.mark.parametrize(("n", "k"), SHAPES_7B)
def test_float32_keeps_one_tile_at_every_m(n: int, k: int) -> None:
    tiles = {mm_config(n, k, m, torch.float32) for m in ROWS}
    assert tiles == {MM_CONFIGS[(n, k)][0][1]}


@pytest.mark.parametrize(("n", "k"), [*SHAPES_7B, (576, 192), (3072, 192), (10000, 300)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("accumulate", [False, True])
def test_the_rows_choose_only_the_grid_and_a_tile_of_their_bucket(
        n: int, k: int, dtype: torch.dtype, accumulate: bool) -> None:
    metas_by_tile: dict[object, list[dict]] = {}
    for m in ROWS:
        grid, meta = mm_launch(m, n, k, dtype, accumulate=accumulate)
        c = mm_config(n, k, m, dtype)
        assert grid == (-(-m // c.block_m) * -(-n // c.block_n),)
        assert (meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"], meta["num_warps"],
                meta["num_stages"]) == (c.block_m, c.block_n, c.block_k, c.num_warps,
                                        c.num_stages)
        metas_by_tile.setdefault(c, []).append(meta)
    for metas in metas_by_tile.values():  # rows of one tile share the compiled kernel
        assert all(meta == metas[0] for meta in metas)
    if (n, k) not in MM_CONFIGS:
        assert len(metas_by_tile) == 1, "one tile outside the 7B table"


def test_float32_runs_in_ieee_and_half_precision_in_the_default() -> None:
    assert mm_launch(1, 64, 64, torch.float32, accumulate=False)[1]["PRECISION"] == "ieee"
    assert mm_launch(1, 64, 64, torch.bfloat16, accumulate=False)[1]["PRECISION"] == "tf32"


@pytest.mark.parametrize("t", [256, 2100, 2900, 4096])
def test_the_attention_kernel_does_not_follow_batch_or_queries(t: int) -> None:
    shapes = [(b, q) for b in (1, 4, 16, 64) for q in (1, 2, 5, 9, 16)]
    launches = [attention_launch(b, q, 32, 128, 32, t, torch.bfloat16) for b, q in shapes]
    assert all(a.meta == launches[0].meta for a in launches)
    assert all(a.combine_meta == launches[0].combine_meta for a in launches)
    assert launches[0].meta["BLOCK_M"] == QUERY_TILE
    for (b, q), a in zip(shapes, launches, strict=True):
        assert a.grid == (b, 32, -(-t // SPLIT)) and a.combine_grid == (b * q, 32)
    # Q > 16 runs as more 16-query tiles of the same kernel.
    wide = attention_launch(4, 33, 32, 128, 32, t, torch.bfloat16)
    assert wide.meta == launches[0].meta and wide.grid[0] == 4 * 3


@given(t=st.integers(1, 20000), split=st.sampled_from([64, 128, 256, 512]))
def test_the_combine_width_is_a_power_of_two_covering_the_slot(t: int, split: int) -> None:
    n = num_splits_for_slot(t, split)
    need = -(-t // split)
    assert n & (n - 1) == 0 and need <= n < 2 * need


def test_the_split_is_whole_blocks() -> None:
    assert SPLIT % ATTN_BLOCK_N == 0
    with pytest.raises(InvalidInput):
        num_splits_for_slot(0)


@settings(max_examples=200)
@given(start=st.integers(0, 4000), length=st.integers(1, 700))
def test_pseudo_sessions_give_each_query_its_verify_step(start: int, length: int) -> None:
    tiles = prefill_pseudo_sessions(start, length)
    assert [s for s, _ in tiles] == list(range(start, start + length, QUERY_TILE))
    for j, (s, seq_len) in enumerate(tiles):
        assert seq_len == min(s + QUERY_TILE, start + length)
        assert s < seq_len  # at least one real query
        if j < len(tiles) - 1:
            assert seq_len - s == QUERY_TILE  # only the last tile is short (padded)
    for p in range(start, start + length):  # query at position p: row p - s of its tile
        s, seq_len = tiles[(p - start) // QUERY_TILE]
        assert s <= p < seq_len and p - s < QUERY_TILE


@settings(max_examples=100)
@given(pieces=st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 200)),
                       min_size=1, max_size=5))
def test_the_prefill_layout_puts_each_query_in_its_own_tile_row(
        pieces: list[tuple[int, int]]) -> None:
    starts = [s for s, _ in pieces]
    lengths = [n for _, n in pieces]
    owner, tile_starts, tile_lens, rows = prefill_layout(starts, lengths)
    assert len(rows) == sum(lengths) and len(set(rows)) == len(rows)
    assert max(rows) < len(tile_starts) * QUERY_TILE
    i = 0
    for piece, (start, length) in enumerate(pieces):
        for j in range(length):  # the j-th query of this piece, at position start + j
            tile, row = divmod(rows[i], QUERY_TILE)
            assert owner[tile] == piece
            assert tile_starts[tile] + row == start + j < tile_lens[tile]
            i += 1


def test_a_bad_piece_is_refused() -> None:
    with pytest.raises(InvalidInput):
        prefill_pseudo_sessions(5, 0)
    with pytest.raises(InvalidInput):
        prefill_pseudo_sessions(-1, 3)


@given(runs=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 11)), min_size=1, max_size=6),
       group=st.integers(1, 5))
def test_prompt_groups_cover_each_pseudo_session_once_and_never_span_two_slots(
        runs: list[tuple[int, int]], group: int) -> None:
    slots = [slot for slot, n in runs for _ in range(n)]
    groups = group_pseudo_sessions(slots, group)
    assert all(len(g) == group for g in groups)
    members = [i for g in groups for i in g if i >= 0]
    assert members == list(range(len(slots)))  # every one, once, in order
    for g in groups:
        real = [i for i in g if i >= 0]
        assert real and g[: len(real)] == real, "padding only after the members"
        assert len({slots[i] for i in real}) == 1, "one slot's keys per program"
    # No group is cut short unless the next pseudo-session is another slot's.
    for a, b in itertools.pairwise(groups):
        if -1 in a:
            assert slots[max(a)] != slots[b[0]]


def test_prefill_tiles_group_only_the_steps_query_tile() -> None:
    grouped = prefill_tiles([3, 5], [0, 0], [70, 20], torch.device("cpu"))
    assert grouped.groups is not None
    assert grouped.groups.tolist() == [[0, 1, 2, 3], [4, -1, -1, -1], [5, 6, -1, -1]]
    assert prefill_tiles([3], [0], [70], torch.device("cpu"), tile=64).groups is None
    with pytest.raises(InvalidInput):
        group_pseudo_sessions([1], 0)
