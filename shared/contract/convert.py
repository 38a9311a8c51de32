"""Protobuf <-> domain conversion of the pieces both services' messages share.

The ``convert*`` modules are the only place (besides transports) that sees pb types. This
one holds the building blocks: generation settings, cost profiles and plans, request
statistics, tensor headers and timelines. The messages of one service are built from
them in :mod:`eventspec.shared.contract.convert_verifier` (``Verifier``: ServerInfo,
the Generate stream) and :mod:`eventspec.shared.contract.convert_ask`
(``EdgeAgent.Ask``), so each module follows one proto file.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeVar

from eventspec.shared.contract.codec import TensorHeaderInfo, WireDtype
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.timeline import MAX_EVENTS, Timeline, TimelineEvent
from eventspec.shared.contract.timing import CloudCost, EdgeCost, TimingPlan
from eventspec.shared.contract.types import GenerationSettings, RequestStats
from eventspec.shared.pb.eventspec.v1 import common_pb2

T = TypeVar("T")


def copy_fields(src: Any, cls: type[T]) -> T:
    """Build dataclass ``cls`` from same-named attributes of ``src`` (a pb message whose
    fields mirror it)."""
    return cls(**{f.name: getattr(src, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


def _finite_fields(obj: Any, what: str) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInput(f"{what}.{f.name} must be finite, got {value}")


# -- generation ---------------------------------------------------------------------------


def generation_to_pb(g: GenerationSettings) -> common_pb2.GenerationConfig:
    return common_pb2.GenerationConfig(
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        seed=g.seed,
        stop=list(g.stop),
    )


def generation_from_pb(m: common_pb2.GenerationConfig) -> GenerationSettings:
    return GenerationSettings(
        max_new_tokens=m.max_new_tokens,
        temperature=m.temperature,
        top_p=m.top_p,
        seed=m.seed,
        stop=tuple(m.stop),
    )


# -- costs and plans ----------------------------------------------------------------------


def cloud_cost_to_pb(c: CloudCost) -> common_pb2.CloudProfile:
    return common_pb2.CloudProfile(**dataclasses.asdict(c))


def cloud_cost_from_pb(m: common_pb2.CloudProfile) -> CloudCost:
    return copy_fields(m, CloudCost)


def edge_cost_to_pb(e: EdgeCost) -> common_pb2.EdgeProfile:
    return common_pb2.EdgeProfile(**dataclasses.asdict(e))


def edge_cost_from_pb(m: common_pb2.EdgeProfile) -> EdgeCost:
    cost = copy_fields(m, EdgeCost)
    _finite_fields(cost, "edge_profile")
    return cost


def plan_to_pb(p: TimingPlan) -> common_pb2.Plan:
    return common_pb2.Plan(**dataclasses.asdict(p))


def plan_from_pb(m: common_pb2.Plan) -> TimingPlan:
    return copy_fields(m, TimingPlan)


# -- statistics ---------------------------------------------------------------------------


def stats_to_pb(s: RequestStats) -> common_pb2.Stats:
    return common_pb2.Stats(
        drafted=s.drafted,
        accepted=s.accepted,
        acceptance_rate=s.acceptance_rate,
        mean_accepted_length=s.mean_accepted_length,
        hidden_drafted=s.hidden_drafted,
        hidden_accepted=s.hidden_accepted,
        target_steps=s.target_steps,
        ttft_ms=s.ttft_ms,
        total_ms=s.total_ms,
        uplink_bytes=s.uplink_bytes,
        downlink_bytes=s.downlink_bytes,
        stage_ms=dict(s.stage_ms),
        new_tokens=s.new_tokens,
        stale_drafts=s.stale_drafts,
        prefix_reused_tokens=s.prefix_reused_tokens,
        prefix_cache=s.prefix_cache,
        drafts_on_offer=s.drafts_on_offer,
        dry_steps=s.dry_steps,
        tree_nodes_sent=s.tree_nodes_sent,
        tree_nodes_pruned=s.tree_nodes_pruned,
        tree_branch_hits=s.tree_branch_hits,
        draft_forward_ms=s.draft_forward_ms,
        plans_sent=s.plans_sent,
        steps_sat_out=s.steps_sat_out,
    )


def stats_from_pb(m: common_pb2.Stats) -> RequestStats:
    return RequestStats(
        drafted=m.drafted,
        accepted=m.accepted,
        hidden_drafted=m.hidden_drafted,
        hidden_accepted=m.hidden_accepted,
        target_steps=m.target_steps,
        ttft_ms=m.ttft_ms,
        total_ms=m.total_ms,
        uplink_bytes=m.uplink_bytes,
        downlink_bytes=m.downlink_bytes,
        new_tokens=m.new_tokens,
        stale_drafts=m.stale_drafts,
        stage_ms=dict(m.stage_ms),
        prefix_reused_tokens=m.prefix_reused_tokens,
        prefix_cache=m.prefix_cache,
        drafts_on_offer=m.drafts_on_offer,
        dry_steps=m.dry_steps,
        tree_nodes_sent=m.tree_nodes_sent,
        tree_nodes_pruned=m.tree_nodes_pruned,
        tree_branch_hits=m.tree_branch_hits,
        draft_forward_ms=m.draft_forward_ms,
        plans_sent=m.plans_sent,
        steps_sat_out=m.steps_sat_out,
    )


# -- tensors ------------------------------------------------------------------------------


def header_to_pb(h: TensorHeaderInfo) -> common_pb2.TensorHeader:
    return common_pb2.TensorHeader(
        name=h.name,
        dtype=h.dtype.value,  # type: ignore[arg-type]
        shape=list(h.shape),
        total_bytes=h.total_bytes,
        crc32=h.crc32,
        num_chunks=h.num_chunks,
        scale=h.scale,
    )


def header_from_pb(m: common_pb2.TensorHeader) -> TensorHeaderInfo:
    try:
        dtype = WireDtype(m.dtype)
    except ValueError:
        raise InvalidInput(
            f"tensor {m.name!r}: unknown or unspecified dtype {m.dtype}"
        ) from None
    return TensorHeaderInfo(
        name=m.name,
        dtype=dtype,
        shape=tuple(int(d) for d in m.shape),
        total_bytes=m.total_bytes,
        crc32=m.crc32,
        num_chunks=m.num_chunks,
        scale=m.scale,
    )


# -- timelines ----------------------------------------------------------------------------


def timeline_to_pb(t: Timeline) -> common_pb2.Timeline:
    return common_pb2.Timeline(
        events=[common_pb2.TimelineEvent(**dataclasses.asdict(e)) for e in t.events],
        dropped=t.dropped, cloud_offset_ms=t.cloud_offset_ms, clock_sync=t.clock_sync,
    )


def timeline_from_pb(m: common_pb2.Timeline, limit: int = MAX_EVENTS) -> Timeline:
    """Convert, keeping at most ``limit`` events (the rest count as dropped): a peer's
    log is bounded here whatever it sent."""
    events = tuple(copy_fields(e, TimelineEvent) for e in m.events[:limit])
    return Timeline(events, max(0, m.dropped) + max(0, len(m.events) - limit),
                    m.cloud_offset_ms, m.clock_sync)
