"""The toy target and its static engine on CUDA, as the GPU tests of prompt work build
them (float32, 4 slots of 512 positions, graphs captured at build)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from eventspec.cloud.engine.static.build import build_static_engine, static_kv_plan
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.model_dirs import TOY, model_dir
from eventspec.cloud.target import TargetModel, load_target


def toy_target() -> TargetModel:
    """The shipped toy Video-LLaVA on the current CUDA device, in float32."""
    return load_target(model_dir(TOY), device="cuda", dtype=torch.float32)


def toy_engine(toy: TargetModel, chunk_buckets: Sequence[int] = ()) -> StaticEngine:
    """A static engine over ``toy``: 4 slots of 512 positions (``chunk_buckets``: the
    piece rows its mixed steps are graphed at)."""
    kv = static_kv_plan(toy, kv_cache_bytes=None, max_seq_len=512, max_slots=4)
    return build_static_engine(toy, kv, chunk_buckets=chunk_buckets)
