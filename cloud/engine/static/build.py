"""Building the static engine: KV slots sized from a byte budget, then graph capture."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from eventspec.cloud.engine.kv import kv_bytes_per_token
from eventspec.cloud.engine.static.buckets import SESSION_BUCKETS, TOKEN_BUCKETS
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.engine.static.weights import static_unsupported_reason
from eventspec.cloud.target import TargetModel
from eventspec.shared.contract.errors import InvalidInput

logger = logging.getLogger(__name__)

#: Device memory kept free when the KV budget is "what is free": graphs, activations.
_CUDA_RESERVE_BYTES = 6 * 2**30


def kv_bytes_per_slot(target: TargetModel, max_seq_len: int) -> int:
    """K and V bytes of one slot of ``max_seq_len`` positions across all layers."""
    text_config = target.model.config.get_text_config(decoder=True)
    return kv_bytes_per_token(text_config, target.dtype) * max_seq_len


def build_static_engine(
    target_model: TargetModel,
    *,
    kv_cache_bytes: int | None,
    max_seq_len: int,
    max_slots: int | None = None,
    use_graphs: bool = True,
    compile_layers: bool = False,
    session_buckets: Sequence[int] = SESSION_BUCKETS,
    token_buckets: Sequence[int] = TOKEN_BUCKETS,
    warm_up: bool = True,
) -> StaticEngine:
    """Reserve KV slots from a byte budget, build the engine, capture its graphs.

    ``kv_cache_bytes`` None means: on CUDA, what is free now minus a reserve for
    graphs and activations; on CPU, room for 8 slots. ``compile_layers`` swaps the
    Triton RMSNorm for an Inductor-compiled one (measured slower; kept for comparison).
    Build it before serving: graph capture must not overlap other CUDA work. The
    scratch slot for padding comes out of the budget too.
    Raises ``InvalidInput`` when the model is unsupported
    (:func:`static_unsupported_reason`) or not even one slot fits.
    """
    reason = static_unsupported_reason(target_model)
    if reason is not None:
        raise InvalidInput(f"the static engine cannot serve this model: {reason}")
    per_slot = kv_bytes_per_slot(target_model, max_seq_len)
    device = target_model.device
    if kv_cache_bytes is None:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            kv_cache_bytes = max(0, free - _CUDA_RESERVE_BYTES)
        else:
            kv_cache_bytes = 9 * per_slot
    slots = kv_cache_bytes // per_slot - 1
    if max_slots is not None:
        slots = min(slots, max_slots)
    if slots < 1:
        raise InvalidInput(
            f"a KV budget of {kv_cache_bytes / 2**30:.2f} GiB holds no slot of "
            f"{max_seq_len} positions ({per_slot / 2**20:.1f} MiB each, plus one for padding)"
        )
    engine = StaticEngine(
        target_model,
        num_slots=slots,
        max_seq_len=max_seq_len,
        use_graphs=use_graphs,
        compile_layers=compile_layers,
        session_buckets=session_buckets,
        token_buckets=token_buckets,
    )
    logger.info(
        "static engine: %d KV slots x %d positions (%.2f GiB), device %s",
        slots, max_seq_len, (slots + 1) * per_slot / 2**30, device,
    )  # fmt: skip
    if warm_up:
        engine.warm_up()
    return engine
