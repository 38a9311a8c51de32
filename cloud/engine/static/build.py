"""Building the static engine from a KV plan (``eventspec.cloud.engine.kv``), then graph
capture; and the plan for a byte budget, for callers without a server's settings."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from eventspec.cloud.engine.kv import GIB, KVPlan, fit_slots, kv_bytes_per_token
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.engine.static.weights import static_unsupported_reason
from eventspec.cloud.target import TargetModel
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.buckets import SESSION_BUCKETS, TOKEN_BUCKETS
from eventspec.shared.node.static.fp8 import fp8_copy_bytes

logger = logging.getLogger(__name__)

#: The slot padded rows write into (``StaticEngine``'s scratch slot): it is allocated
#: next to the sessions' slots, so it comes out of the KV budget too.
SCRATCH_SLOTS = 1
#: Device memory kept free when the KV budget is "what is free": graphs, activations.
_CUDA_RESERVE_BYTES = 6 * 2**30
#: Session slots on CPU when no budget is given.
_CPU_DEFAULT_SLOTS = 8


def kv_bytes_per_slot(target: TargetModel, max_seq_len: int) -> int:
    """K and V bytes of one slot of ``max_seq_len`` positions across all layers."""
    text_config = target.model.config.get_text_config(decoder=True)
    return kv_bytes_per_token(text_config, target.dtype) * max_seq_len


def fp8_copy_bytes_for(text_config: Any) -> int:
    """Device bytes ``--prefill-dtype fp8`` (or ``step_dtype="fp8"``) add for a LLaMA text
    config, so the KV budget leaves them free (``fp8.fp8_copy_bytes``)."""
    c = text_config
    heads = int(c.num_attention_heads)
    return fp8_copy_bytes(layers=int(c.num_hidden_layers), hidden=int(c.hidden_size),
                          heads=heads, kv_heads=int(c.num_key_value_heads),
                          head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // heads),
                          intermediate=int(c.intermediate_size))


def static_kv_plan(
    target_model: TargetModel,
    *,
    kv_cache_bytes: int | None,
    max_seq_len: int,
    max_slots: int | None = None,
) -> KVPlan:
    """The static engine's slots in a byte budget (its scratch slot included).

    ``kv_cache_bytes`` None means: on CUDA, what is free now minus a reserve for graphs
    and activations; on CPU, room for 8 slots. The server plans from its own settings
    instead (``plan_kv`` with ``scratch_slots=SCRATCH_SLOTS``); both size through
    :func:`~eventspec.cloud.engine.kv.fit_slots`.
    """
    text_config = target_model.model.config.get_text_config(decoder=True)
    bytes_per_token = kv_bytes_per_token(text_config, target_model.dtype)
    per_slot = bytes_per_token * max_seq_len
    device = target_model.device
    if kv_cache_bytes is not None:
        source = "the given budget"
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        kv_cache_bytes = max(0, free - _CUDA_RESERVE_BYTES)
        source = f"{free / GIB:.1f} GiB free on {device} less {_CUDA_RESERVE_BYTES / GIB:.0f} GiB"
    else:
        kv_cache_bytes = (_CPU_DEFAULT_SLOTS + SCRATCH_SLOTS) * per_slot
        source = f"room for {_CPU_DEFAULT_SLOTS} slots on CPU"
    return fit_slots(kv_cache_bytes, source, bytes_per_token=bytes_per_token,
                     max_seq_len=max_seq_len, max_slots=max_slots, scratch_slots=SCRATCH_SLOTS)


def build_static_engine(
    target_model: TargetModel,
    kv: KVPlan,
    *,
    use_graphs: bool = True,
    compile_layers: bool = False,
    session_buckets: Sequence[int] = SESSION_BUCKETS,
    token_buckets: Sequence[int] = TOKEN_BUCKETS,
    warm_up: bool = True,
    batch_invariant: bool = False,
    chunk_buckets: Sequence[int] = (),
    prefill_dtype: str = "model",
    step_dtype: str = "model",
) -> StaticEngine:
    """Build the engine with ``kv.num_slots`` slots of ``kv.max_seq_len``, capture its graphs.

    ``kv`` must hold the scratch slot for padding (``static_kv_plan``, or ``plan_kv``
    with ``scratch_slots=SCRATCH_SLOTS``). ``compile_layers`` swaps the Triton RMSNorm
    for an Inductor-compiled one (measured slower; kept for comparison). Build it before
    serving: graph capture must not overlap other CUDA work. Raises ``InvalidInput``
    when the model is unsupported (:func:`static_unsupported_reason`) or the plan holds
    no scratch slot. ``prefill_dtype`` / ``step_dtype`` "fp8": prefill calls / steps on
    fp8 copies of the decoder's weights (``eventspec.shared.node.static.fp8``; one copy
    for both, and the plan must leave room: :func:`fp8_copy_bytes_for`).
    """
    reason = static_unsupported_reason(target_model)
    if reason is not None:
        raise InvalidInput(f"the static engine cannot serve this model: {reason}")
    if kv.scratch_slots < SCRATCH_SLOTS:
        raise InvalidInput(f"the static engine needs {SCRATCH_SLOTS} scratch KV slot in its "
                           f"budget; this plan holds {kv.scratch_slots}")
    engine = StaticEngine(
        target_model,
        num_slots=kv.num_slots,
        max_seq_len=kv.max_seq_len,
        use_graphs=use_graphs,
        compile_layers=compile_layers,
        session_buckets=session_buckets,
        token_buckets=token_buckets,
        batch_invariant=batch_invariant,
        kv_positions=kv.arena_positions or None,
        chunk_buckets=chunk_buckets,
        prefill_dtype=prefill_dtype,
        step_dtype=step_dtype,
    )
    if kv.arena_positions:
        logger.info("static engine: KV by length, %d positions for up to %d sessions "
                    "(%.2f GiB with the scratch window), device %s", kv.arena_positions,
                    engine.num_slots, (kv.arena_positions + kv.max_seq_len) * kv.bytes_per_token
                    / GIB, target_model.device)
    else:
        logger.info(
            "static engine: %d KV slots x %d positions (%.2f GiB), device %s",
            engine.num_slots, engine.max_seq_len,
            (engine.num_slots + SCRATCH_SLOTS) * kv.slot_bytes / GIB, target_model.device,
        )  # fmt: skip
    if warm_up:
        engine.warm_up()
    return engine
