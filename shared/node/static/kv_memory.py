"""The static runtime's K or V memory: fixed slots, or one arena of positions seen as
slots (KV by length).

Both are a [layers, slots + 1, Hkv, T, D] tensor to every kernel, which addresses
``slot * stride(0) + head * stride(1) + pos * stride(2)``. Fixed slots are that tensor,
contiguous; the arena is an [layers, Hkv, A + T, D] tensor behind a strided view whose
slot stride is one position, so "slot" s is the T-position window starting at position
s and a session owns the run ``[s, s + n)`` its allocator gave it
(``eventspec.cloud.scheduling.kv_arena``); the window at A is the padding rows' scratch.
"""

from __future__ import annotations

import torch

from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.slot_occupancy import SlotOccupancy


def kv_tensor(*, layers: int, slots: int, kv_heads: int, positions: int, head_dim: int,
              arena_positions: int | None, device: torch.device,
              dtype: torch.dtype) -> torch.Tensor:
    """Zeroed K or V memory as [layers, slots + 1, Hkv, T, D] (T = ``positions`` a slot):
    contiguous slots, or with ``arena_positions`` = A a view of an [layers, Hkv, A + T, D]
    arena, slot s = position s (then ``slots`` is ignored: the view has A + 1).

    Zeroed, not empty: the CPU path's dense attention multiplies masked-out positions by
    0, and 0 * NaN garbage would poison a row. Raises InvalidInput for an arena past 2^31
    elements a layer (the Triton kernels multiply a head by its stride in int32).
    """
    t, d = positions, head_dim
    if arena_positions is None:
        return torch.zeros((layers, slots + 1, kv_heads, t, d), device=device, dtype=dtype)
    span = arena_positions + t  # the arena, then the scratch window
    if kv_heads * span * d >= 2**31:
        raise InvalidInput(
            f"a KV arena of {arena_positions} positions x {kv_heads} KV heads x {d} is past "
            "2^31 elements a layer; lower --kv-cache-gb or --max-sessions, or use "
            "--kv-layout slots")
    arena = torch.zeros((layers, kv_heads, span, d), device=device, dtype=dtype)
    return arena.as_strided((layers, arena_positions + 1, kv_heads, t, d),
                            (kv_heads * span * d, d, span * d, d, 1))


def rows_of(cache: torch.Tensor) -> torch.Tensor:
    """One layer's K or V memory as [rows, D] from its first element: the slots' memory,
    contiguous or the arena behind a strided view (its storage offset kept), for
    ``index_copy_`` at row ``(slot * stride(0) + head * stride(1) + pos * stride(2)) / D``."""
    d = cache.shape[-1]
    last = sum((n - 1) * st for n, st in zip(cache.shape, cache.stride(), strict=True))
    return cache.as_strided((last // d + 1, d), (d, 1))


def save_prefix(k_cache: torch.Tensor, v_cache: torch.Tensor, occupancy: SlotOccupancy,
                slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A copy of the first ``length`` positions of ``slot``'s K and V, each
    [layers, Hkv, length, D], for :func:`load_prefix` into another slot later."""
    occupancy.check_slot(slot)
    if not 0 < length <= occupancy.filled(slot):
        raise InvalidInput(f"slot {slot} holds {occupancy.filled(slot)} prompt "
                           f"positions; cannot save {length}")
    return (k_cache[:, slot, :, :length].clone(),
            v_cache[:, slot, :, :length].clone())


def load_prefix(k_cache: torch.Tensor, v_cache: torch.Tensor, occupancy: SlotOccupancy,
                slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Copy a saved prefix (:func:`save_prefix`) into positions 0.. of ``slot`` (K and V
    memory [L, S+1, Hkv, T, D]); a prefill of the rest continues from its length."""
    occupancy.check_slot(slot)
    n = int(k.shape[2]) if k.dim() == 4 else 0
    want = (k_cache.shape[0], k_cache.shape[2], n, k_cache.shape[4])
    room = occupancy.room(slot)
    if tuple(k.shape) != want or tuple(v.shape) != want or not 0 < n < room:
        raise InvalidInput(f"a prefix must be K and V of {list(want)} with 0 < length < "
                           f"{room}, got {list(k.shape)} and {list(v.shape)}")
    k_cache[:, slot, :, :n].copy_(k)
    v_cache[:, slot, :, :n].copy_(v)
    occupancy.prompt_written_to(slot, n)
