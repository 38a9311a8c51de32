"""OpenTelemetry traces across edge and cloud: off by default, and free when off.

Tracing is on when the standard environment asks for an exporter
(``OTEL_TRACES_EXPORTER`` other than ``none``, or an ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); the OTLP exporter then reads every other
``OTEL_*`` variable itself (endpoint, headers, protocol, ``OTEL_SERVICE_NAME``). When it
is off, no OpenTelemetry module is imported and the only cost is one ``None`` check per
request.

Spans are made after the fact from the request's timeline
(``eventspec.shared.contract.timeline``): each side already logs when its stages began and ended on
its own clock, so one span per Ask (edge) or Generate (cloud) gets a child per stage with its real
start and end times, without a context manager held across the request's awaits. The edge's Ask span
context travels to the cloud in the Generate call's metadata (W3C ``traceparent``), so
one request is one trace across both machines.
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from eventspec.shared.contract.timeline import TimelineEvent

log = logging.getLogger(__name__)

#: Metadata for the cloud call of the Ask running in this task: its trace context.
_OUTGOING: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "eventspec_trace_metadata", default=())
#: The root span of the request this task serves (None: tracing is off).
_CURRENT: contextvars.ContextVar[RequestSpan | None] = contextvars.ContextVar(
    "eventspec_request_span", default=None)
#: The metadata of the call this task serves (the cloud reads its parent trace from it).
_INCOMING: contextvars.ContextVar[tuple[tuple[str, Any], ...]] = contextvars.ContextVar(
    "eventspec_incoming_metadata", default=())

#: Drafted tokens closer than this (ms) belong to one drafting burst (one span).
BURST_GAP_MS = 1.0

#: Span names of timeline lanes; lanes not listed here make no span.
EDGE_SPANS = {"edge.render": "window + render", "edge.uplink": "uplink",
              "edge.draft_prefill": "draft prefill", "edge.commit": "commit received"}
CLOUD_SPANS = {"cloud.queue": "queue", "cloud.prefill": "prefill",
               "cloud.verify": "verify step", "cloud.commit": "commit sent",
               "cloud.done": "Done"}


def tracing_requested(env: dict[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` environment asks for traces to be exported."""
    env = dict(os.environ) if env is None else env
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def tracer_from_env(service_name: str) -> Any | None:
    """A tracer exporting as the ``OTEL_*`` environment says, or None when it says
    nothing (then nothing is imported). ``OTEL_SERVICE_NAME`` overrides the name."""
    if not tracing_requested():
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    exporter: Any
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTEL_* asks for traces, but opentelemetry-exporter-otlp-proto-grpc "
                        "is not installed: pip install 'eventspec[tracing]'; tracing is off")
            return None
        exporter = OTLPSpanExporter()
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing on: %s exporter, service %s", exporter_name, name)
    return provider.get_tracer("eventspec")


def set_outgoing(metadata: tuple[tuple[str, str], ...]) -> None:
    """Carry ``metadata`` (a trace context) on this task's calls to the cloud."""
    _OUTGOING.set(metadata)


def outgoing_metadata() -> tuple[tuple[str, str], ...]:
    """The trace context for a call made now (empty when tracing is off)."""
    return _OUTGOING.get()


def set_incoming(metadata: Iterable[tuple[str, Any]] | None) -> None:
    """The metadata of the call this task serves (the servicer sets it when tracing)."""
    _INCOMING.set(tuple(metadata or ()))


def incoming_metadata() -> tuple[tuple[str, Any], ...]:
    return _INCOMING.get()


def current_request_span() -> RequestSpan | None:
    """The root span of the request this task serves, when tracing is on."""
    return _CURRENT.get()


def wall_ns(perf: float) -> int:
    """``time.perf_counter()`` value ``perf`` as wall-clock ns (for span times)."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)


@dataclass
class RequestSpan:
    """One request's root span, begun when the request began; children are added at
    its end from the timeline."""

    tracer: Any
    span: Any
    #: Events to make children of at ``finish``, and the perf_counter of their 0 ms.
    events: Sequence[TimelineEvent] = ()
    zero_perf: float = 0.0

    @staticmethod
    def begin(tracer: Any, name: str, *, parent_metadata: Iterable[tuple[str, Any]] = (),
              attributes: dict[str, Any] | None = None) -> RequestSpan:
        """Start ``name``, child of the trace context in ``parent_metadata`` if any."""
        from opentelemetry.propagate import extract

        carrier = {str(k): str(v) for k, v in parent_metadata}
        parent = extract(carrier) if "traceparent" in carrier else None
        span = tracer.start_span(name, context=parent, attributes=attributes or {})
        return RequestSpan(tracer, span)

    def make_current(self) -> None:
        """This task's request span, and its context on this task's calls to the cloud."""
        _CURRENT.set(self)
        _OUTGOING.set(self.metadata())

    def attach(self, events: Sequence[TimelineEvent], zero_perf: float) -> None:
        """Make children of ``events`` (0 ms = perf_counter ``zero_perf``) at ``finish``."""
        self.events, self.zero_perf = events, zero_perf

    def add_children(self, events: Sequence[TimelineEvent], lanes: dict[str, str],
                     zero_perf: float) -> None:
        """Children now, from ``events`` (0 ms = perf_counter ``zero_perf``)."""
        from opentelemetry import trace

        ctx = trace.set_span_in_context(self.span)
        zero = wall_ns(zero_perf)
        for name, start_ms, end_ms, attrs in _children(events, lanes):
            child = self.tracer.start_span(name, context=ctx,
                                           start_time=zero + int(start_ms * 1e6),
                                           attributes=attrs)
            child.end(end_time=zero + int(end_ms * 1e6))

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """This span's context as gRPC metadata (W3C ``traceparent``)."""
        from opentelemetry import trace
        from opentelemetry.propagate import inject

        carrier: dict[str, str] = {}
        inject(carrier, context=trace.set_span_in_context(self.span))
        return tuple(carrier.items())

    def finish(self, lanes: dict[str, str], *, attributes: dict[str, Any] | None = None,
               error: str | None = None) -> None:
        """Children from the attached events (the lanes named in ``lanes``, drafted
        tokens as bursts), then end the root span."""
        from opentelemetry import trace

        if self.events:
            self.add_children(self.events, lanes, self.zero_perf)
        if attributes:
            self.span.set_attributes(attributes)
        if error is not None:
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        self.span.end()


def final_attributes(final: Any) -> dict[str, Any]:
    """Span attributes from a request's final statistics (a FinalEvent or DoneEvent)."""
    if final is None:
        return {}
    s = final.stats
    return {"eventspec.finish_reason": final.finish_reason.name.lower(),
            "eventspec.new_tokens": s.new_tokens, "eventspec.drafted": s.drafted,
            "eventspec.accepted": s.accepted, "eventspec.hidden_drafted": s.hidden_drafted,
            "eventspec.hidden_accepted": s.hidden_accepted,
            "eventspec.target_steps": s.target_steps}


def _children(events: Sequence[TimelineEvent], lanes: dict[str, str]
              ) -> list[tuple[str, float, float, dict[str, Any]]]:
    """(name, start, end, attributes) of each child span, in time order."""
    out: list[tuple[str, float, float, dict[str, Any]]] = []
    burst: list[TimelineEvent] = []

    def close_burst() -> None:
        if burst:
            out.append(("drafting burst", burst[0].start_ms, burst[-1].end_ms,
                        {"eventspec.tokens": len(burst)}))
            burst.clear()

    for e in sorted(events, key=lambda e: e.start_ms):
        if e.lane == "edge.draft":
            if burst and e.start_ms - burst[-1].end_ms > BURST_GAP_MS:
                close_burst()
            burst.append(e)
            continue
        name = lanes.get(e.lane)
        if name is None:
            continue
        attrs: dict[str, Any] = {"eventspec.tokens": e.tokens}
        if e.lane in ("cloud.verify", "cloud.prefill", "edge.commit", "cloud.commit"):
            attrs.update({"eventspec.k": e.verified, "eventspec.accepted": e.accepted})
        out.append((name, e.start_ms, e.end_ms, attrs))
    close_burst()
    return sorted(out, key=lambda c: c[1])
