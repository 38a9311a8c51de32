"""The fixed-shape layout of prompt pieces in a mixed step (``chunk_staging``), on many
piece patterns: every real row lands once, at its position and slot; padding writes only
the scratch slot; each tile is a causal pseudo-session of its piece; the piece's last
row is where the logits are read."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy, graphed_piece_rows
from eventspec.shared.node.static.buckets import CHUNK_TILE
from eventspec.shared.node.static.chunk_staging import (
    CHUNK_SPLIT,
    MAX_PIECES,
    SMALL_PIECE_SPLIT,
    ChunkStaging,
    chunk_rows_for,
    chunk_split,
)
from eventspec.shared.node.static.invariant_tiles import ATTN_BLOCK_N, cdiv

SCRATCH, T = 99, 512

pieces_strategy = st.lists(st.tuples(st.integers(0, 300), st.integers(1, 150)),
                           min_size=1, max_size=MAX_PIECES)


def staging(cap_rows: int = 768) -> ChunkStaging:
    return ChunkStaging(torch.device("cpu"), torch.float32, 8, max_seq_len=T,
                        scratch_slot=SCRATCH, cap_rows=cap_rows)


@given(pieces=pieces_strategy)
def test_every_real_row_lands_once_and_padding_only_in_scratch(
        pieces: list[tuple[int, int]]) -> None:
    starts, lengths = [p[0] for p in pieces], [p[1] for p in pieces]
    slots = list(range(len(pieces)))
    rows = chunk_rows_for(lengths, (768,))
    assert rows == 768  # at most 4 pieces of <= 3 tiles each
    s = staging()
    embeds = [torch.full((n, 8), float(r + 1)) for r, n in enumerate(lengths)]
    inp = s.load(slots, starts, embeds, rows)
    written = list(zip(inp.write_slot.tolist(), inp.write_pos.tolist(), strict=True))
    real = [w for w in written if w[0] != SCRATCH]
    assert sorted(real) == sorted((r, first + j) for r, (first, n) in enumerate(pieces)
                                  for j in range(n))
    assert all(0 <= p < T for _, p in written)
    for r, (first, n) in enumerate(pieces):
        last = int(inp.last_rows[r])
        assert inp.write_slot[last] == r and inp.write_pos[last] == first + n - 1
        assert inp.pos[last] == first + n - 1
        assert torch.equal(inp.h[last], embeds[r][-1])
    tiles = list(zip(inp.slots.tolist(), inp.starts.tolist(), inp.seq_lens.tolist(),
                     strict=True))
    assert len(tiles) == rows // CHUNK_TILE
    for r, (first, n) in enumerate(pieces):  # its tiles: causal over [0, first + n)
        mine = [t for t in tiles if t[0] == r]
        assert len(mine) == cdiv(n, CHUNK_TILE)
        assert [t[1] for t in mine] == list(range(first, first + n, CHUNK_TILE))
        assert [t[2] for t in mine] == [min(t[1] + CHUNK_TILE, first + n) for t in mine]
    assert all(t[0] == SCRATCH for t in tiles[sum(cdiv(n, CHUNK_TILE) for n in lengths):])


@given(lengths=st.lists(st.integers(1, 400), min_size=1, max_size=6),
       buckets=st.lists(st.sampled_from([64, 128, 256, 512, 576]), min_size=1, max_size=3))
def test_pieces_fit_the_smallest_bucket_of_their_whole_tiles(lengths: list[int],
                                                             buckets: list[int]) -> None:
    buckets = sorted(set(buckets))
    need = sum(cdiv(n, CHUNK_TILE) for n in lengths) * CHUNK_TILE
    got = chunk_rows_for(lengths, buckets)
    if len(lengths) > MAX_PIECES or need > buckets[-1]:
        assert got is None
    else:
        assert got == min(b for b in buckets if b >= need)


def test_graphed_piece_rows_follow_the_fixed_chunk() -> None:
    assert graphed_piece_rows(ChunkPolicy.parse("512"), 4096) == (64, 512, 576)
    assert graphed_piece_rows(ChunkPolicy.parse("500"), 4096) == (64, 512, 576)
    assert graphed_piece_rows(ChunkPolicy.parse("64"), 4096) == (64, 128)
    assert graphed_piece_rows(ChunkPolicy.parse("512"), 540) == (64, 512)
    assert graphed_piece_rows(ChunkPolicy.parse("auto"), 4096) == ()
    assert graphed_piece_rows(ChunkPolicy.parse("off"), 4096) == ()


def test_piece_rows_must_be_whole_tiles() -> None:
    with pytest.raises(ValueError, match="multiple of 64"):
        staging(cap_rows=100)


def test_small_pieces_split_their_keys_finer() -> None:
    """A piece of one or two tiles gets more, shorter key splits (more programs for the
    GPU); every split is whole key blocks, as the attention kernel requires."""
    assert chunk_split(64) == chunk_split(128) == SMALL_PIECE_SPLIT < CHUNK_SPLIT
    assert chunk_split(192) == chunk_split(576) == CHUNK_SPLIT
    assert SMALL_PIECE_SPLIT % ATTN_BLOCK_N == CHUNK_SPLIT % ATTN_BLOCK_N == 0
