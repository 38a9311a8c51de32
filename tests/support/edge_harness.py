"""Helpers to run client -> edge -> cloud in one process over real gRPC on loopback."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.paced import PacedEngine
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_draft import build_tiny_random_draft
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.edge.config import EdgeSettings
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.events.base import EventSource
from eventspec.edge.server import EdgeServer
from eventspec.edge.vision.align import FeatureAdapter, build_adapter_for
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.types import (
    AskSpec,
    FeatureMode,
    FinalEvent,
    GenerationSettings,
    Mode,
)
from eventspec.shared.wire.security import ServerSecurity
from tests.support import cloud_harness as ch


def slow_cost(prefill_delay_s: float, step_delay_s: float) -> CloudCost:
    """The cost model that describes the paced engine (what calibration would measure)."""
    return CloudCost(
        prefill_base_ms=prefill_delay_s * 1e3,
        prefill_ms_per_visual_token=0.01,
        prefill_ms_per_text_token=0.01,
        step_base_ms=step_delay_s * 1e3,
        step_ms_per_token=0.05,
        device="test-double",
    )


@dataclass
class Stack:
    cloud: VerifierServer
    edge: EdgeServer
    target: TargetModel
    draft: DraftModel

    @property
    def edge_address(self) -> str:
        return f"127.0.0.1:{self.edge.port}"

    async def stop(self) -> None:
        await self.edge.stop(0)
        await self.cloud.stop(0)


_TARGET: TargetModel | None = None
_DRAFT: DraftModel | None = None


def shared_models() -> tuple[TargetModel, DraftModel]:
    """One tiny target and draft per test process (building them costs seconds)."""
    global _TARGET, _DRAFT
    if _TARGET is None:
        _TARGET = build_tiny_random_target(seed=0)
    if _DRAFT is None:
        _DRAFT = build_tiny_random_draft(seed=0)
    return _TARGET, _DRAFT


_TOY_TARGET: TargetModel | None = None


async def start_secure_cloud(security: ServerSecurity) -> VerifierServer:
    """A started verifier of :func:`shared_models`' target behind ``security``."""
    target, _ = shared_models()
    server = VerifierServer(replace(ch.settings(max_sessions=4), security=security),
                            target=target, cost=ch.TEST_COST)
    await server.start()
    return server


def toy_target() -> TargetModel:
    """The shipped toy target, once per test process (the toy draft agrees with it)."""
    global _TOY_TARGET
    if _TOY_TARGET is None:
        from eventspec.cloud.model_dirs import TOY, model_dir
        from eventspec.cloud.target import load_target

        _TOY_TARGET = load_target(model_dir(TOY))
    return _TOY_TARGET


async def start_toy_stack(
    seed: int, *, slow: tuple[float, float] | None = None,
    edge_settings: dict[str, Any] | None = None,
) -> tuple[VerifierServer, EdgeServer]:
    """The toy pair on toy scene ``seed``: the cloud's toy target (optionally paced) and
    an edge that loads the shipped toy draft and adapter itself (``model="toy"``).
    Unlike the tiny random pair, the draft's tokens are mostly accepted."""
    from eventspec.edge.events.toy import ToySource

    target = toy_target()
    engine = cost = None
    if slow is not None:
        engine = PacedEngine(HFEngine(target), prefill_ms=slow[0] * 1e3, step_ms=slow[1] * 1e3)
        cost = slow_cost(*slow)
    cloud = VerifierServer(ch.settings(max_sessions=4), target=target, engine=engine,
                           cost=cost or ch.TEST_COST)
    await cloud.start()
    settings = replace(EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0, model="toy",
                       **(edge_settings or {}))
    edge = EdgeServer(settings, source=ToySource([seed]))
    try:
        await edge.start()
    except BaseException:
        await cloud.stop(0)
        raise
    return cloud, edge


def adapter_for(target: TargetModel, draft: DraftModel) -> FeatureAdapter:
    """An untrained adapter from the draft's CLIP features to the target's video space."""
    s = draft.image_size
    clip = draft.clip_features(torch.zeros(5, 3, s, s))  # [5, T_s, D_s]
    g = target.geometry
    return build_adapter_for(tuple(clip.shape), (g.num_frames, g.tokens_per_frame, g.feature_dim))


async def start_stack(
    *,
    source: EventSource | None = None,
    slow: tuple[float, float] | None = None,
    adapter: bool | FeatureAdapter = False,
    edge_settings: dict[str, Any] | None = None,
    models: tuple[TargetModel, DraftModel] | None = None,
) -> Stack:
    """Cloud (optionally a slowed double) + edge on port 0, both SERVING."""
    target, draft = models or shared_models()
    engine = cost = None
    if slow is not None:
        # A test double for a loaded cloud: the real engine paced to fixed times. A prefill
        # slower than the edge's guarantees hidden drafts; a slow step makes drafting pay.
        engine = PacedEngine(HFEngine(target), prefill_ms=slow[0] * 1e3, step_ms=slow[1] * 1e3)
        cost = slow_cost(*slow)
    cloud = VerifierServer(ch.settings(max_sessions=4), target=target, engine=engine,
                           cost=cost or ch.TEST_COST)
    await cloud.start()
    settings = replace(EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0,
                       **(edge_settings or {}))
    if isinstance(adapter, FeatureAdapter):
        chosen: FeatureAdapter | None = adapter
    else:
        chosen = adapter_for(target, draft) if adapter else None
    edge = EdgeServer(settings, source=source, draft=draft, adapter=chosen)
    await edge.start()
    return Stack(cloud, edge, target, draft)


async def ask(address: str, question: str, mode: Mode, *, seed: int = 0, max_new: int = 16,
              feature_mode: FeatureMode = FeatureMode.AUTO, **window: int) -> FinalEvent:
    """One Ask through a real ``EdgeClient``; the final event."""
    async with EdgeClient(address, timeout_s=120) as client:
        return await client.ask_final(AskSpec(
            question, mode=mode, feature_mode=feature_mode,
            generation=GenerationSettings(max_new_tokens=max_new, seed=seed), **window,
        ))


@contextlib.asynccontextmanager
async def edge_to(cloud: str, **settings: Any) -> AsyncIterator[EdgeServer]:
    """A real edge on port 0 over the shared tiny drafter, talking to ``cloud``, with
    ``settings`` over the defaults; stopped on exit."""
    _, draft = shared_models()
    edge = EdgeServer(replace(EdgeSettings(), cloud=cloud, port=0, **settings), draft=draft)
    await edge.start()
    try:
        yield edge
    finally:
        await edge.stop(0)

