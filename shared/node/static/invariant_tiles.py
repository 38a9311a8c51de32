"""The host-side rules of the batch-invariant Triton kernels (:mod:`.invariant_kernels`).

Kept apart from the kernels so they can be read, and tested on CPU, without Triton:
the GEMM tiles of each weight shape and why, the attention's fixed split size and query
tile, the launch arguments (where B and Q may only change a grid, and M a grid and
a tile among bit-equal ones), and how a prompt piece is cut into 16-query pseudo-sessions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch

from eventspec.shared.contract.errors import InvalidInput

__all__ = [
    "ATTN_BLOCK_N",
    "ATTN_WARPS",
    "MM_CONFIGS",
    "PROMPT_GROUP",
    "QUERY_TILE",
    "SPLIT",
    "AttentionLaunch",
    "MmConfig",
    "PrefillTiles",
    "attention_launch",
    "cdiv",
    "dot_precision",
    "group_pseudo_sessions",
    "mm_config",
    "mm_launch",
    "num_splits_for_slot",
    "prefill_layout",
    "prefill_pseudo_sessions",
    "prefill_tiles",
]

@dataclass(frozen=True)
class MmConfig:
    """One tile configuration of :func:`invariant_mm` (Triton's launch parameters)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    #: Row tiles of one column stripe that run next to each other (they share the
    #: stripe's weights in L2); a scheduling choice only, it changes no bits.
    group_m: int = 8
    #: The persistent TMA-fed kernel (:mod:`.invariant_tma`; compute capability 9.0+,
    #: 16-bit dtypes) instead of the pointer-fed one: the same arithmetic, fed faster.
    persistent: bool = False


#: Why a tile may follow M at all: a row's bits depend on the order K is summed in and
#: on the MMA instruction that sums each chunk, not on how rows and columns are tiled
#: (module docstring of :mod:`.invariant_kernels`). Every tile below walks K in order
#: into one fp32 accumulator (``tl.dot(x, w, acc)``) and is a wgmma tile (BLOCK_M a
#: multiple of 64, warps a multiple of 4), so in bf16/fp16 a row gets the same bits
#: under each of them. Measured, not only argued: ``python -m
#: benchmarks.bench_invariant_kernels --cross-tiles`` on an H200 (Triton 3.6) found every
#: such tile of every 7B shape, at BLOCK_K 64 and 128, bitwise equal on 2,100 rows
#: (``benchmarks/results/invariant-cross-tiles-h200.json``), and ``make test-gpu``
#: checks the table's own tiles against each other. float32 (``ieee`` dots, no tensor
#: cores) was not measured, so it keeps the first tile at every M.
#:
#: (last M of the bucket, tile): decode steps are bandwidth-bound and want many column
#: stripes; prompts (M ~ 2,100) are compute-bound and want big tiles. Each is the
#: fastest bit-equal tile at the measured M of its bucket (1/16/64, 144, 576, 2,100),
#: pointer-fed or persistent (``P``, :mod:`.invariant_tma`): ``python -m
#: benchmarks.probe_invariant_persistent`` on an H200 found every persistent tile tried
#: bitwise equal to the pointer-fed table's, and the decoder's GEMMs at 2,100 rows
#: 1.15x cuBLAS with them against 1.54x without
#: (``benchmarks/results/invariant-persistent-probe-h200.json``).
MmBuckets = tuple[tuple[int, MmConfig], ...]
#: A bucket bound past any M (the last bucket's).
ANY_M: Final = 1 << 62
#: The persistent tile most prompts' GEMMs run on.
_P128x256: Final = MmConfig(128, 256, 64, 8, 3, persistent=True)
_QKV: Final[MmBuckets] = ((64, MmConfig(64, 32, 64, 4, 4)), (320, _P128x256),
                          (1024, _P128x256), (ANY_M, _P128x256))
_WO: Final[MmBuckets] = ((64, MmConfig(64, 32, 128, 4, 4)),
                         (320, MmConfig(64, 128, 128, 4, 4, persistent=True)), (1024, _P128x256),
                         (ANY_M, MmConfig(64, 128, 128, 4, 4, persistent=True)))
_DOWN: Final[MmBuckets] = ((64, MmConfig(64, 32, 128, 4, 4)),
                           (320, MmConfig(64, 128, 128, 4, 4, persistent=True)),
                           (1024, _P128x256),
                           (ANY_M, MmConfig(64, 128, 128, 4, 4, persistent=True)))
_GATE_UP: Final[MmBuckets] = ((64, MmConfig(64, 64, 64, 4, 4)),
                              (320, MmConfig(64, 128, 64, 4, 4)),
                              (1024, _P128x256), (ANY_M, _P128x256))
_LM_HEAD: Final[MmBuckets] = ((320, MmConfig(64, 128, 64, 4, 4)), (1024, _P128x256),
                              (ANY_M, _P128x256))
#: The tiles of every 7B (LLaMA-7B / Video-LLaVA-7B) weight shape, keyed by (N, K).
MM_CONFIGS: Final[dict[tuple[int, int], MmBuckets]] = {
    (12288, 4096): _QKV,  # fused QKV
    (4096, 4096): _WO,  # wo
    (22016, 4096): _GATE_UP,  # fused gate-up
    (4096, 11008): _DOWN,  # down
    (32000, 4096): _LM_HEAD,  # LLaMA's LM head
    (32064, 4096): _LM_HEAD,  # Video-LLaVA's LM head
}
#: Shapes outside the table (smaller models, the toy): one tile at every M, by N alone.
WIDE_CONFIG: Final = MmConfig(64, 64, 64, 4, 3)
NARROW_CONFIG: Final = MmConfig(64, 32, 64, 4, 3)
#: N from which :data:`WIDE_CONFIG` applies.
WIDE_N: Final = 8192

#: Query rows per attention tile, for every Q (a verify step's 9, a decode's 1, a
#: prefill's pseudo-session of 16).
QUERY_TILE: Final = 16
#: Key positions per attention split, counted from position 0. Larger splits mean
#: fewer partial outputs (memory [B Q, cdiv(T, SPLIT), H, D] fp32 and its traffic),
#: smaller ones more programs for a lone session. On an H200 256 beat 128 for a
#: 2,100-token prompt (0.47 against 0.60 ms a layer) and for steps of 16 and 64
#: sessions (``invariant-persistent-probe-h200.json``, ``invariant-kernels-h200.json``).
SPLIT: Final = 256
#: Pseudo-sessions of one prompt piece one program of the prompt kernel runs on one
#: load of each key block (:mod:`.invariant_prompt`).
PROMPT_GROUP: Final = 4
#: Key positions per block inside a split (SPLIT must be a multiple).
ATTN_BLOCK_N: Final = 64
#: Warps of the split kernel (fixed: it changes the MMA layout).
ATTN_WARPS: Final = 4


def mm_config(n: int, k: int, m: int = 1, dtype: torch.dtype = torch.bfloat16) -> MmConfig:
    """The tile for ``x [M, K] @ w [N, K].T``: a function of (N, K) and M's bucket
    (16-bit dtypes; float32 keeps the first bucket's tile at every M), never of what
    else is in the batch."""
    buckets = MM_CONFIGS.get((n, k))
    if buckets is None:
        return WIDE_CONFIG if n >= WIDE_N else NARROW_CONFIG
    if dtype == torch.float32:
        return buckets[0][1]
    return next(c for last_m, c in buckets if m <= last_m)


def num_splits_for_slot(max_positions: int, split: int = SPLIT) -> int:
    """The combine's split count: a power of two >= cdiv(T, split), T = the slot's
    positions (so it follows the KV cache's shape, never B or Q)."""
    if max_positions < 1 or split < 1:
        raise InvalidInput(f"splits of {split} over {max_positions} positions")
    need = -(-max_positions // split)
    return 1 << (need - 1).bit_length()


def prefill_pseudo_sessions(
    start: int, length: int, tile: int = QUERY_TILE
) -> list[tuple[int, int]]:
    """(start, seq_len) of each pseudo-session of a prompt piece of ``length`` queries
    at positions ``start`` .. ``start + length - 1``: tile j holds queries
    ``start + tile j`` .. and may read keys up to ``start + tile (j + 1)``, clamped
    to the piece's end, as a verify step of those queries would."""
    if start < 0 or length < 1 or tile < 1:
        raise InvalidInput(f"a prefill piece of {length} queries from {start}")
    end = start + length
    return [(s, min(s + tile, end)) for s in range(start, end, tile)]


def prefill_layout(
    starts: Sequence[int], lengths: Sequence[int], tile: int = QUERY_TILE
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Pseudo-sessions of several pieces (concatenated as the prefill concatenates
    their rows): (piece of each tile, tile starts, tile seq_lens, rows) where
    ``rows[i]`` is the padded row ([tiles * tile] rows) of the i-th concatenated query."""
    pieces: list[int] = []
    tile_starts: list[int] = []
    tile_lens: list[int] = []
    rows: list[int] = []
    for piece, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        base = len(tile_starts) * tile
        rows.extend(range(base, base + length))
        for s, n in prefill_pseudo_sessions(start, length, tile):
            pieces.append(piece)
            tile_starts.append(s)
            tile_lens.append(n)
    return pieces, tile_starts, tile_lens, rows


@dataclass(frozen=True)
class PrefillTiles:
    """A prefill's pseudo-sessions on the device (built once, used by every layer)."""

    slots: torch.Tensor  # [P]
    starts: torch.Tensor  # [P]
    seq_lens: torch.Tensor  # [P]
    rows: torch.Tensor  # [M] padded row of each query
    #: Queries per pseudo-session (the attention kernel's query tile).
    tile: int = QUERY_TILE
    #: [G, PROMPT_GROUP] pseudo-sessions each program of the prompt kernel runs (-1:
    #: none), from :func:`group_pseudo_sessions`; None: one program per pseudo-session.
    groups: torch.Tensor | None = None


def group_pseudo_sessions(slots: Sequence[int], group: int = PROMPT_GROUP) -> list[list[int]]:
    """Consecutive pseudo-sessions in groups of up to ``group`` (their indices, -1
    padding the last of a run): a group never spans two slots, since its program reads
    one slot's keys for all of them."""
    if group < 1:
        raise InvalidInput(f"a group of {group} pseudo-sessions")
    out: list[list[int]] = []
    for i, slot in enumerate(slots):
        if out and len([j for j in out[-1] if j >= 0]) < group and slots[out[-1][0]] == slot:
            out[-1][out[-1].index(-1)] = i
        else:
            out.append([i] + [-1] * (group - 1))
    return out


def prefill_tiles(
    slots: Sequence[int], starts: Sequence[int], lengths: Sequence[int], device: torch.device,
    tile: int = QUERY_TILE,
) -> PrefillTiles:
    """:func:`prefill_layout` of the pieces (slot r from start r, length r) as tensors,
    in pseudo-sessions of ``tile`` queries."""
    pieces, tile_starts, tile_lens, rows = prefill_layout(starts, lengths, tile)
    tile_slots = [slots[p] for p in pieces]

    def t(values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(device)

    groups = None
    if tile == QUERY_TILE:
        groups = torch.tensor(group_pseudo_sessions(tile_slots), dtype=torch.long).to(device)
    return PrefillTiles(t(tile_slots), t(tile_starts), t(tile_lens), t(rows), tile, groups)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def mm_launch(
    m: int, n: int, k: int, dtype: torch.dtype, *, accumulate: bool,
    config: MmConfig | None = None,
) -> tuple[tuple[int], dict[str, Any]]:
    """(grid, compile-time arguments) of :func:`invariant_mm` for x [M, K] @ w [N, K].T.

    M sets the grid and picks the tile among (N, K)'s bit-equal ones
    (:data:`MM_CONFIGS`); the other compile-time arguments come from the dtype and
    whether the residual is added.
    """
    c = config or mm_config(n, k, m, dtype)
    meta: dict[str, Any] = {
        "ACCUMULATE": accumulate, "PRECISION": dot_precision(dtype), "BLOCK_M": c.block_m,
        "BLOCK_N": c.block_n, "BLOCK_K": c.block_k, "GROUP_M": c.group_m,
        "num_warps": c.num_warps, "num_stages": c.num_stages,
    }
    return (cdiv(m, c.block_m) * cdiv(n, c.block_n),), meta


@dataclass(frozen=True)
class AttentionLaunch:
    """The two launches of :func:`fixed_split_attention` for one call's shape."""

    grid: tuple[int, int, int]  # (B x query tiles, heads, allocated splits)
    meta: dict[str, Any]  # the split kernel's compile-time arguments
    combine_grid: tuple[int, int]  # (B Q rows, heads)
    combine_meta: dict[str, Any]
    num_alloc: int  # cdiv(T, split): the splits a slot holds (partials allocated)
    q_tiles: int  # cdiv(Q, query tile)


def attention_launch(
    bp: int, nq: int, heads: int, head_dim: int, kv_heads: int, max_positions: int,
    dtype: torch.dtype, split: int = SPLIT, query_tile: int = QUERY_TILE,
) -> AttentionLaunch:
    """Launch shapes of :func:`fixed_split_attention`: B and Q change only the grids
    (and the runtime arguments ``num_q``/``q_tiles``, not specialised on); the
    compile-time arguments follow the heads, the dtype, the split and the slot size T."""
    num_alloc = cdiv(max_positions, split)
    q_tiles = cdiv(nq, query_tile)
    meta: dict[str, Any] = {
        "GROUPS": heads // kv_heads, "HEAD_DIM": head_dim, "BLOCK_M": query_tile,
        "BLOCK_N": ATTN_BLOCK_N, "SPLIT": split, "PRECISION": dot_precision(dtype),
        "num_warps": ATTN_WARPS, "num_stages": 2,
    }
    combine_meta: dict[str, Any] = {
        "HEAD_DIM": head_dim, "BLOCK_M": query_tile, "SPLIT": split,
        "NUM_SPLITS": num_splits_for_slot(max_positions, split), "num_warps": 1,
    }
    return AttentionLaunch((bp * q_tiles, heads, num_alloc), meta, (bp * nq, heads),
                           combine_meta, num_alloc, q_tiles)


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: IEEE fp32 for float32 (the toy's fp32 path stays
    fp32, as cuBLAS keeps it without TF32), the default otherwise (ignored for 16-bit)."""
    return "ieee" if dtype == torch.float32 else "tf32"
