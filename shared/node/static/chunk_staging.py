"""Prompt pieces inside a graphed step: their rows at a fixed count, their index arrays
in one staged block, their attention as 64-query pseudo-sessions.

A mixed step (Sarathi-Serve's stall-free batching, Agrawal et al., OSDI 2024) carries
the decode and verify rows of the running sessions and pieces of waiting prompts. Eager,
it paid the 32 layers' kernel launches every step (about 9 ms at full size, twice a
graphed step). To replay it from a CUDA graph, everything it reads must sit at fixed
addresses and shapes, whatever the pieces:

- the pieces' rows are padded to ``rows`` (a bucket, a multiple of :data:`CHUNK_TILE`):
  piece r takes whole tiles of :data:`CHUNK_TILE` rows from the next free one; padding
  rows write their K/V into the scratch slot, as a step's padding does;
- their embeddings are copied into one static [rows, H] buffer;
- each tile is a pseudo-session of the step's attention contract (slot, start, seq_len
  on the device): tile i of a piece at ``start`` holds queries ``start + 64 i`` .. and
  reads keys below ``min(start + 64 (i + 1), start + L)``, which is causal prefill
  over the slot (the batch-invariant prefill cuts pieces the same way, in 16-query
  tiles). On CUDA the attention is :func:`.invariant_kernels.fixed_split_attention` with
  a 64-query tile; on CPU :func:`.attention.reference_attention`;
- each piece's last row, whose logits give its prompt's first token, is an index on the
  device too (at most :data:`MAX_PIECES` pieces a step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from eventspec.shared.node.static.buckets import CHUNK_TILE as CHUNK_TILE  # re-exported
from eventspec.shared.node.static.buckets import MAX_PIECES as MAX_PIECES  # re-exported
from eventspec.shared.node.static.buckets import bucket
from eventspec.shared.node.static.invariant_tiles import cdiv, prefill_pseudo_sessions

#: Key positions per split of their attention (fewer, longer splits than a decode
#: step's: a tile of 64 queries already gives the grid its programs) ...
CHUNK_SPLIT = 1024
#: ... except for pieces of at most two tiles (a question after a reused clip, a
#: prompt's last words), which would leave most of the GPU idle: 1 tile x 32 heads x 3
#: splits is 96 programs at 2k positions, for 132 SMs on an H100.
SMALL_PIECE_SPLIT = 256


def chunk_split(rows: int) -> int:
    """Key positions per attention split for pieces padded to ``rows``."""
    return SMALL_PIECE_SPLIT if rows <= 2 * CHUNK_TILE else CHUNK_SPLIT


def chunk_rows_for(lengths: Sequence[int], buckets: Sequence[int]) -> int | None:
    """The smallest of ``buckets`` holding pieces of ``lengths`` rows in whole tiles
    (None: too many pieces, or more rows than the largest bucket)."""
    if not lengths or len(lengths) > MAX_PIECES or min(lengths) < 1:
        return None
    return bucket(sum(cdiv(n, CHUNK_TILE) for n in lengths) * CHUNK_TILE, buckets)


@dataclass(frozen=True)
class ChunkInputs:
    """Device tensors the pieces' rows of a mixed step read (static views under graphs)."""

    h: torch.Tensor  # [C, H] embeddings
    pos: torch.Tensor  # [C] positions (RoPE rows)
    write_slot: torch.Tensor  # [C] slot each row's K/V goes to (scratch for padding)
    write_pos: torch.Tensor  # [C]
    slots: torch.Tensor  # [P] each tile's slot, P = C / CHUNK_TILE
    starts: torch.Tensor  # [P] each tile's first query position
    seq_lens: torch.Tensor  # [P] keys each tile may read
    last_rows: torch.Tensor  # [MAX_PIECES] each piece's last row among the C (padding: 0)
    rows: int  # C


class ChunkStaging:
    """Static buffers for pieces of up to ``cap_rows`` rows, and the host work that fills
    them (one pinned, asynchronous copy of an int64 block, as :mod:`.staging` does)."""

    def __init__(self, device: torch.device, dtype: torch.dtype, hidden: int, *,
                 max_seq_len: int, scratch_slot: int, cap_rows: int) -> None:
        if cap_rows < CHUNK_TILE or cap_rows % CHUNK_TILE:
            raise ValueError(f"piece rows must be a multiple of {CHUNK_TILE}, got {cap_rows}")
        self.device = device
        self.max_seq_len = max_seq_len
        self.scratch_slot = scratch_slot
        self.cap_rows = cap_rows
        self.cap_tiles = cap_rows // CHUNK_TILE
        self.embeds = torch.zeros(cap_rows, hidden, device=device, dtype=dtype)  # [Cmax, H]
        self.meta = torch.zeros(self._size, device=device, dtype=torch.long)

    @property
    def _size(self) -> int:
        return 3 * self.cap_rows + 3 * self.cap_tiles + MAX_PIECES

    def host_meta(self, slots: Sequence[int], starts: Sequence[int], lengths: Sequence[int],
                  rows: int) -> tuple[np.ndarray[Any, Any], list[int]]:
        """The pieces' index arrays in the block's layout; returns it and each piece's
        first row among the ``rows``. Tiles no piece uses read the scratch slot."""
        c, p, cc, cp = rows, rows // CHUNK_TILE, self.cap_rows, self.cap_tiles
        t_last = self.max_seq_len - 1
        j = np.arange(c, dtype=np.int64)
        pos, wslot, wpos = np.zeros(c, np.int64), np.full(c, self.scratch_slot), j % (t_last + 1)
        tslot = np.full(p, self.scratch_slot, np.int64)
        tstart = np.zeros(p, np.int64)
        tlen = np.full(p, CHUNK_TILE, np.int64)
        last = np.zeros(MAX_PIECES, np.int64)
        firsts, tile = [], 0
        for r, (s, st, n) in enumerate(zip(slots, starts, lengths, strict=True)):
            tiles, base = cdiv(n, CHUNK_TILE), tile * CHUNK_TILE
            firsts.append(base)
            span = np.arange(tiles * CHUNK_TILE, dtype=np.int64)  # the piece's rows
            pos[base : base + span.size] = np.minimum(st + span, t_last)
            wslot[base : base + n], wpos[base : base + n] = s, st + span[:n]
            tslot[tile : tile + tiles] = s
            tstart[tile : tile + tiles], tlen[tile : tile + tiles] = zip(
                *prefill_pseudo_sessions(st, n, CHUNK_TILE), strict=True)
            last[r] = base + n - 1
            tile += tiles
        block = np.zeros(self._size, dtype=np.int64)
        block[:c], block[cc : cc + c], block[2 * cc : 2 * cc + c] = pos, wslot, wpos
        o = 3 * cc
        block[o : o + p], block[o + cp : o + cp + p] = tslot, tstart
        block[o + 2 * cp : o + 2 * cp + p] = tlen
        block[o + 3 * cp :] = last
        return block, firsts

    def load(self, slots: Sequence[int], starts: Sequence[int],
             embeds: Sequence[torch.Tensor], rows: int) -> ChunkInputs:
        """Fill the buffers for pieces (embeds[r]: [L_r, H]) padded to ``rows``."""
        lengths = [int(e.shape[0]) for e in embeds]
        block, firsts = self.host_meta(slots, starts, lengths, rows)
        host = torch.from_numpy(block)
        if self.device.type == "cuda":
            host = host.pin_memory()
        self.meta.copy_(host, non_blocking=True)
        for first, e in zip(firsts, embeds, strict=True):
            self.embeds[first : first + e.shape[0]].copy_(e)
        return self.inputs(rows)

    def dummy(self, rows: int) -> ChunkInputs:
        """All-padding inputs for capture: every row and tile in the scratch slot."""
        block, _ = self.host_meta([], [], [], rows)
        self.meta.copy_(torch.from_numpy(block))
        return self.inputs(rows)

    def inputs(self, rows: int) -> ChunkInputs:
        """Views of the static buffers for ``rows`` (fixed addresses per bucket)."""
        m, c, cc, cp = self.meta, rows, self.cap_rows, self.cap_tiles
        p, o = rows // CHUNK_TILE, 3 * cc
        return ChunkInputs(
            h=self.embeds[:c], pos=m[:c], write_slot=m[cc : cc + c],
            write_pos=m[2 * cc : 2 * cc + c], slots=m[o : o + p],
            starts=m[o + cp : o + cp + p], seq_lens=m[o + 2 * cp : o + 2 * cp + p],
            last_rows=m[o + 3 * cp : o + 3 * cp + MAX_PIECES], rows=c,
        )
