"""The EdgeAgent gRPC servicer: thin. Parses, delegates to ``eventspec.edge.ask.agent``,
converts."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from eventspec.edge.ask.agent import EdgeAgent
from eventspec.edge.events.base import SourceMeta
from eventspec.edge.events.live import LiveSource
from eventspec.edge.events.live_sources import StreamHealth
from eventspec.edge.readiness import Readiness
from eventspec.shared.contract import convert_ask
from eventspec.shared.contract.errors import EventSpecError
from eventspec.shared.contract.types import AskSpec, FinalEvent, ProgressEvent
from eventspec.shared.node.tracing import RequestSpan, final_attributes
from eventspec.shared.pb.eventspec.v1 import edge_pb2, edge_pb2_grpc

if TYPE_CHECKING:
    from eventspec.edge.metrics import AskProbe, EdgeMetrics


class EdgeAgentServicer(edge_pb2_grpc.EdgeAgentServicer):
    """``eventspec.v1.EdgeAgent`` over an ``EdgeAgent`` (attached once it is warm).

    Before then Asks wait for warm-up, at most ``wait_s`` and the call's deadline, with
    progress; GetStatus reports NOT_SERVING and why.
    """

    def __init__(self, readiness: Readiness, *, wait_s: float = 60.0) -> None:
        self.readiness = readiness
        self.wait_s = wait_s
        self.agent: EdgeAgent | None = None
        self.draft_model_id = ""
        self.adapter_id = ""
        self.vision_backend = ""
        self.draft_engine = ""
        #: Prometheus metrics (``--metrics-port``); None: nothing is recorded.
        self.metrics: EdgeMetrics | None = None
        #: An OpenTelemetry tracer (``eventspec.shared.node.tracing``); None: tracing is off.
        self.tracer: Any = None
        self._started = time.monotonic()

    def attach(self, agent: EdgeAgent, *, draft_model_id: str, adapter_id: str = "",
               vision_backend: str = "", draft_engine: str = "") -> None:
        self.agent = agent
        self.draft_engine = draft_engine
        self.draft_model_id = draft_model_id
        self.adapter_id = adapter_id
        self.vision_backend = vision_backend

    async def Ask(
        self, request: edge_pb2.AskRequest, context: Any
    ) -> AsyncIterator[edge_pb2.AskResponse]:
        spec = convert_ask.ask_spec_from_pb(request)
        if self.metrics is None and self.tracer is None:
            async for msg in self._ask(spec, context):
                yield msg
            return
        probe = self.metrics.ask(spec.mode) if self.metrics is not None else None
        span = None
        if self.tracer is not None:
            span = RequestSpan.begin(self.tracer, "Ask",
                                     parent_metadata=context.invocation_metadata() or (),
                                     attributes={"eventspec.mode": spec.mode.name.lower()})
            span.make_current()  # the agent adds its stages; the cloud call carries it
        error: str | None = "cancelled"
        finals: list[FinalEvent] = []
        try:
            async for msg in self._ask(spec, context, probe, finals):
                yield msg
            error = None
        except EventSpecError as exc:
            error = f"{exc.code.name}: {exc.message}"
            if probe is not None:
                probe.on_error(exc)
            raise
        except BaseException:
            if probe is not None:
                probe.on_error(None)
            raise
        finally:
            if span is not None:
                span.finish({}, attributes=final_attributes(finals[-1] if finals else None),
                            error=error)

    async def _ask(
        self, spec: AskSpec, context: Any, probe: AskProbe | None = None,
        finals: list[FinalEvent] | None = None,
    ) -> AsyncIterator[edge_pb2.AskResponse]:
        left = context.time_remaining()
        started = time.monotonic()
        budget = self.wait_s if left is None else min(self.wait_s, max(0.0, left - 1.0))
        shown = None
        while self.agent is None:
            waited = time.monotonic() - started
            if waited >= budget:
                raise self.readiness.timeout_error(needs_cloud=False, waited_s=waited)
            waiting = self.readiness.waiting(needs_cloud=False)
            if waiting is not None and waiting != shown:
                shown = waiting
                yield convert_ask.ask_event_to_pb(ProgressEvent(waiting.stage, waiting.message,
                                                            round(waited, 3)))
            await self.readiness.next_change(budget - waited)
        left = context.time_remaining()
        async for event in self.agent.ask(spec, deadline_s=left):
            if probe is not None:
                probe.on_event(event)
            if finals is not None and isinstance(event, FinalEvent):
                finals.append(event)
            yield convert_ask.ask_event_to_pb(event)

    async def GetStatus(
        self, request: edge_pb2.GetStatusRequest, context: Any
    ) -> edge_pb2.EdgeStatus:
        readiness = edge_pb2.EdgeStatus(
            serving=self.readiness.serving,
            not_serving_reason=self.readiness.not_serving_reason(),
            uptime_s=time.monotonic() - self._started,
        )
        agent = self.agent
        if agent is None:  # still warming up: only the readiness is known
            return readiness
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
                cloud_state=self.readiness.cloud.describe(),
            )
        status = edge_pb2.EdgeStatus(
            source=src.describe(),
            sensor_width=width,
            sensor_height=height,
            source_t0_us=t0,
            source_t1_us=t1,
            has_rgb=src.has_rgb,
            draft_model_id=self.draft_model_id,
            adapter_id=self.adapter_id,
            vision_backend=self.vision_backend,
            draft_engine=self.draft_engine,
            link=link,
            requests_served=agent.requests_served,
            acceptance_ewma=agent.acceptance.value,
            asks_in_flight=agent.admission.in_flight,
            asks_waiting=agent.admission.waiting,
            cloud_slots=agent.admission.capacity if agent.link is not None else 0,
            uptime_s=time.monotonic() - self._started,
            **source_status(src),
        )
        status.MergeFrom(readiness)
        return status


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
