"""The EdgeAgent gRPC servicer: thin. Parses, delegates to ``edge.agent``, converts."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from edge.agent import EdgeAgent
from edge.events.base import SourceMeta
from edge.events.live import LiveSource
from edge.events.live_sources import StreamHealth
from shared import convert
from shared.errors import EventSpecError
from shared.pb.eventspec.v1 import edge_pb2, edge_pb2_grpc


class EdgeAgentServicer(edge_pb2_grpc.EdgeAgentServicer):
    """``eventspec.v1.EdgeAgent`` over an ``EdgeAgent``."""

    def __init__(self, agent: EdgeAgent, *, draft_model_id: str, adapter_id: str = "") -> None:
        self.agent = agent
        self.draft_model_id = draft_model_id
        self.adapter_id = adapter_id

    async def Ask(
        self, request: edge_pb2.AskRequest, context: Any
    ) -> AsyncIterator[edge_pb2.AskResponse]:
        spec = convert.ask_spec_from_pb(request)
        async for event in self.agent.ask(spec):
            yield convert.ask_event_to_pb(event)

    async def GetStatus(
        self, request: edge_pb2.GetStatusRequest, context: Any
    ) -> edge_pb2.EdgeStatus:
        agent = self.agent
        src = agent.source
        width, height = src.sensor_size
        try:
            t0, t1 = src.time_range_us()
        except EventSpecError:  # a live source before its first event
            t0 = t1 = 0
        link = edge_pb2.LinkStatus()
        if agent.link is not None:
            if not agent.link.reachable:
                with contextlib.suppress(EventSpecError):  # reported via last_error below
                    await agent.link.server_info(agent.rpc_timeout_s)
            link = edge_pb2.LinkStatus(
                cloud_address=agent.link.address,
                reachable=agent.link.reachable,
                rtt_ms=agent.link.rtt.value,
                last_error=agent.link.last_error,
                cloud_model_id=agent.link.info.model_id if agent.link.info else "",
            )
        return edge_pb2.EdgeStatus(
            source=src.describe(),
            sensor_width=width,
            sensor_height=height,
            source_t0_us=t0,
            source_t1_us=t1,
            has_rgb=src.has_rgb,
            draft_model_id=self.draft_model_id,
            adapter_id=self.adapter_id,
            link=link,
            requests_served=agent.requests_served,
            acceptance_ewma=agent.acceptance.value,
            **source_status(src),
        )


def source_status(src: object) -> dict[str, Any]:
    """EdgeStatus fields a source can report: format, size provenance, time base, and
    for live sources the stream's health and buffer counters."""
    out: dict[str, Any] = {}
    meta = getattr(src, "meta", None)
    if isinstance(meta, SourceMeta):
        out.update(source_format=meta.format, sensor_size_from=meta.size_from,
                   time_base=meta.time_base)
    if isinstance(src, LiveSource):
        stats = src.buffer.stats()
        health = src.health()
        live = edge_pb2.LiveStatus(
            received=stats.received, dropped=stats.dropped, buffered=stats.buffered,
            ended=src.finished, connected=not src.finished, seconds_since_data=-1.0,
        )
        if isinstance(health, StreamHealth):
            live.connected = health.connected
            live.reconnects = health.reconnects
            live.last_error = health.last_error
            live.seconds_since_data = health.seconds_since_data
        out.update(live=live, time_base=out.get("time_base") or "µs on the camera clock")
    return out
