"""How many KV slots fit: the memory budget turned into (slots x positions) at start-up.

Why up front: an engine that lets sessions grow KV on demand fails with an
out-of-memory error in the middle of someone's answer. Reserving slots from a budget
instead makes capacity a number the server can advertise (``GetServerInfo.limits``),
log, and refuse past with RESOURCE_EXHAUSTED (DESIGN.md, "Cloud execution").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from eventspec.shared.contract.errors import InvalidInput

GIB = 1 << 30
#: Budget on a CPU device, where "free device memory" is not a useful number.
CPU_DEFAULT_KV_GB = 2.0
#: Question tokens a slot has room for when ``--max-seq-len`` is not given.
AUTO_QUESTION_TOKENS = 256


def auto_max_seq_len(prompt_base_len: int, max_new_tokens: int, model_max: int) -> int:
    """Positions per slot when ``--max-seq-len`` is not given: the prompt's template and
    video rows, ``AUTO_QUESTION_TOKENS`` of question and the answer cap, at most the
    model's positions.

    Why not the model's maximum: a full-size Video-LLaVA request needs about 2,100
    prompt positions plus its answer, and 4,096-position slots left 45% of an 80 GB
    card's KV idle (28 slots where 44 fit). A longer question still fits: its answer
    cap shrinks to the room left, and the Plan says so (``clamp_to_context``).
    """
    return max(2, min(model_max, prompt_base_len + AUTO_QUESTION_TOKENS + max_new_tokens))


@dataclass(frozen=True)
class KVPlan:
    """The reservation: ``num_slots`` slots of ``max_seq_len`` positions each, plus
    ``scratch_slots`` the engine keeps for itself out of the same budget (the static
    engine's padding slot). Sessions get ``num_slots``; the engine is built with it."""

    num_slots: int
    max_seq_len: int
    bytes_per_token: int
    budget_bytes: int
    source: str  # where the budget came from, for the start-up log
    scratch_slots: int = 0
    #: KV by length (``eventspec.cloud.scheduling.kv_arena``): positions of the arena requests take
    #: their runs from; ``num_slots`` is then the most sessions at once. 0: fixed slots.
    arena_positions: int = 0

    @property
    def slot_bytes(self) -> int:
        return self.bytes_per_token * self.max_seq_len

    @property
    def kv_bytes(self) -> int:
        """K and V bytes the engine allocates for the plan: the slots and the scratch
        ones, or the arena and its scratch window."""
        if self.arena_positions:
            return (self.arena_positions + self.max_seq_len) * self.bytes_per_token
        return (self.num_slots + self.scratch_slots) * self.slot_bytes

    def describe(self) -> str:
        if self.arena_positions:
            return (
                f"KV by length: an arena of {self.arena_positions} positions "
                f"({self.arena_positions * self.bytes_per_token / GIB:.2f} GiB, "
                f"{self.bytes_per_token} B/token) + a {self.max_seq_len}-position scratch "
                f"window, at most {self.num_slots} sessions of at most {self.max_seq_len} "
                f"positions each (budget {self.budget_bytes / GIB:.2f} GiB from {self.source})"
            )
        scratch = f" + {self.scratch_slots} scratch" if self.scratch_slots else ""
        return (
            f"{self.num_slots} KV slots{scratch} x {self.max_seq_len} tokens "
            f"({self.slot_bytes / GIB:.3f} GiB each, {self.bytes_per_token} B/token; "
            f"budget {self.budget_bytes / GIB:.2f} GiB from {self.source})"
        )


def kv_bytes_per_token(text_config: Any, dtype: torch.dtype) -> int:
    """K and V of every layer for one position: 2 x layers x kv_heads x head_dim x itemsize."""
    heads = int(text_config.num_attention_heads)
    kv_heads = int(getattr(text_config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text_config, "head_dim", None) or text_config.hidden_size // heads)
    layers = int(text_config.num_hidden_layers)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * layers * kv_heads * head_dim * itemsize


def fit_slots(
    budget_bytes: int,
    source: str,
    *,
    bytes_per_token: int,
    max_seq_len: int,
    max_slots: int | None,
    scratch_slots: int = 0,
) -> KVPlan:
    """The one place slots are sized: as many slots of ``max_seq_len`` positions as the
    budget holds once the engine's ``scratch_slots`` are taken out of it, at most
    ``max_slots`` (None: no cap). Raises InvalidInput when not one slot fits."""
    if max_seq_len < 1 or bytes_per_token < 1 or scratch_slots < 0:
        raise InvalidInput(f"max_seq_len and bytes_per_token must be >= 1 and scratch_slots "
                           f">= 0, got {max_seq_len}, {bytes_per_token}, {scratch_slots}")
    slot_bytes = bytes_per_token * max_seq_len
    slots = budget_bytes // slot_bytes - scratch_slots
    if max_slots is not None:
        slots = min(slots, max_slots)
    if slots < 1:
        scratch = f", plus {scratch_slots} scratch for padding" if scratch_slots else ""
        raise InvalidInput(
            f"the KV budget of {budget_bytes / GIB:.3f} GiB ({source}) holds no slot of "
            f"{max_seq_len} tokens ({slot_bytes / GIB:.3f} GiB each{scratch}); raise "
            "--kv-cache-gb or lower --max-seq-len"
        )
    return KVPlan(int(slots), max_seq_len, bytes_per_token, budget_bytes, source, scratch_slots)


def fit_arena(
    budget_bytes: int,
    source: str,
    *,
    bytes_per_token: int,
    max_seq_len: int,
    max_sessions: int,
) -> KVPlan:
    """KV by length: the budget as one arena of positions, less a ``max_seq_len``
    window of scratch for padding rows; at most ``max_sessions`` at once, so at most
    ``max_sessions x max_seq_len`` positions (more could never be used). Raises
    InvalidInput when the arena cannot hold one request of ``max_seq_len``."""
    if max_seq_len < 1 or bytes_per_token < 1 or max_sessions < 1:
        raise InvalidInput(f"max_seq_len, bytes_per_token and max_sessions must be >= 1, got "
                           f"{max_seq_len}, {bytes_per_token}, {max_sessions}")
    positions = budget_bytes // bytes_per_token - max_seq_len
    if positions < max_seq_len:
        raise InvalidInput(
            f"the KV budget of {budget_bytes / GIB:.3f} GiB ({source}) holds "
            f"{budget_bytes // bytes_per_token} positions: not one request of {max_seq_len} "
            f"plus as many for padding; raise --kv-cache-gb or lower --max-seq-len"
        )
    positions = min(positions, max_sessions * max_seq_len)
    return KVPlan(max_sessions, max_seq_len, bytes_per_token, budget_bytes, source,
                  scratch_slots=1, arena_positions=int(positions))


def plan_kv(
    *,
    bytes_per_token: int,
    max_seq_len: int,
    device: torch.device,
    kv_cache_gb: float | None,
    memory_fraction: float,
    max_slots: int,
    scratch_slots: int = 0,
    reserved_bytes: int = 0,
    by_length: bool = False,
) -> KVPlan:
    """The server's budget: ``kv_cache_gb``, else a fraction of free device memory (CUDA)
    less ``reserved_bytes`` (the prefix cache's, the fp8 prefill's weights), or
    ``CPU_DEFAULT_KV_GB`` (CPU); then
    :func:`fit_slots`, at most ``max_slots`` (the session cap, since a slot nobody can
    use is wasted memory), or with ``by_length`` :func:`fit_arena` for at most
    ``max_slots`` sessions. Raises InvalidInput when not one request fits."""
    if kv_cache_gb is not None:
        if not kv_cache_gb > 0:
            raise InvalidInput(f"--kv-cache-gb must be > 0, got {kv_cache_gb}")
        budget, source = int(kv_cache_gb * GIB), "--kv-cache-gb"
    elif device.type == "cuda":
        if not 0 < memory_fraction <= 1:
            raise InvalidInput(f"kv memory fraction must be in (0, 1], got {memory_fraction}")
        free, _total = torch.cuda.mem_get_info(device)
        budget = max(0, int(free * memory_fraction) - reserved_bytes)
        source = f"{memory_fraction:.0%} of {free / GIB:.1f} GiB free on {device}"
        if reserved_bytes:
            source += (f" less {reserved_bytes / GIB:.1f} GiB set aside (prefix cache, fp8 "
                       "prefill weights)")
    else:
        budget, source = int(CPU_DEFAULT_KV_GB * GIB), f"the CPU default of {CPU_DEFAULT_KV_GB} GiB"
    if by_length:
        return fit_arena(budget, source, bytes_per_token=bytes_per_token,
                         max_seq_len=max_seq_len, max_sessions=max_slots)
    return fit_slots(budget, source, bytes_per_token=bytes_per_token, max_seq_len=max_seq_len,
                     max_slots=max_slots, scratch_slots=scratch_slots)


def device_free_bytes(device: torch.device) -> int:
    """What PyTorch can still allocate on CUDA ``device``: the driver's free memory and
    the blocks its caching allocator holds unused (it frees them before it fails)."""
    free, _total = torch.cuda.mem_get_info(device)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free + unused)


def check_beside_explicit_kv(plan: KVPlan, *, free_bytes: int, beside_bytes: int,
                             beside: str) -> None:
    """An explicit ``--kv-cache-gb`` is the KV alone: what start-up allocates beside it
    (``beside``, ``beside_bytes``: the fp8 prefill's weight copy) is not taken out of
    it as it is out of a budget drawn from free memory. When the two cannot both fit in
    ``free_bytes``, building the engine would fail with a bare CUDA out-of-memory error;
    this says so first, naming the flags. Raises InvalidInput."""
    if plan.kv_bytes + beside_bytes <= free_bytes:
        return
    raise InvalidInput(
        f"--kv-cache-gb plans {plan.kv_bytes / GIB:.2f} GiB of KV, and {beside} needs "
        f"{beside_bytes / GIB:.2f} GiB beside it: more than the {free_bytes / GIB:.2f} GiB "
        "free; lower --kv-cache-gb (the KV alone), or leave it out for a budget that "
        "leaves room for both")
