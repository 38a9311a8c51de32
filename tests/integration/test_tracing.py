"""Traces across both machines (issue 21): one Ask is one trace, edge and cloud.

A real cloud and a real edge over gRPC, each with its own tracer provider (as two
processes would have) exporting to one in-memory exporter. One speculative Ask must
yield one trace: an ``Ask`` span on the edge with a child per stage (window + render,
uplink, draft prefill, drafting bursts, each commit received) and, through the trace
context in the Generate call's metadata, a ``Generate`` span on the cloud whose parent
is the Ask, with children for the queue, the prefill, each verify step (its k and
accepted) and Done. With no ``OTEL_*`` exporter configured, the servers have no tracer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.paced import PacedEngine
from eventspec.cloud.server import VerifierServer
from eventspec.edge.config import EdgeSettings
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.contract.types import AskSpec, GenerationSettings, Mode
from eventspec.shared.node.tracing import tracer_from_env, tracing_requested
from tests.support import cloud_harness as ch
from tests.support import edge_harness as eh


@pytest.fixture
def mp(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    return monkeypatch


def tracer(service: str, exporter: InMemorySpanExporter) -> object:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("eventspec")


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans
            if s.parent is not None and s.parent.span_id == parent.context.span_id]


async def test_one_ask_is_one_trace_across_edge_and_cloud() -> None:
    exporter = InMemorySpanExporter()
    target, draft = eh.shared_models()
    cloud = VerifierServer(ch.settings(max_sessions=4), target=target,
                           engine=PacedEngine(HFEngine(target), prefill_ms=150.0, step_ms=20.0),
                           cost=eh.slow_cost(0.15, 0.02),
                           tracer=tracer("eventspec-cloud", exporter))
    await cloud.start()
    edge = EdgeServer(replace(EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0,
                              speculation="always"),
                      draft=draft, tracer=tracer("eventspec-edge", exporter))
    try:
        await edge.start()
        async with EdgeClient(f"127.0.0.1:{edge.port}", timeout_s=60) as client:
            final = await client.ask_final(AskSpec(
                "What is moving?", mode=Mode.SPECULATIVE,
                generation=GenerationSettings(max_new_tokens=8)))
    finally:
        await edge.stop(0)
        await cloud.stop(0)
    assert final.timeline is None, "the trace records a timeline the client did not ask for"

    spans = list(exporter.get_finished_spans())
    asks = [s for s in spans if s.name == "Ask"]
    generates = [s for s in spans if s.name == "Generate"]
    assert len(asks) == 1 and len(generates) == 1
    ask, generate = asks[0], generates[0]
    assert ask.context is not None and generate.context is not None
    assert {s.context.trace_id for s in spans if s.context is not None} == {
        ask.context.trace_id}, "one request, one trace"
    assert ask.parent is None
    assert generate.parent is not None and generate.parent.span_id == ask.context.span_id
    assert ask.resource.attributes["service.name"] == "eventspec-edge"
    assert generate.resource.attributes["service.name"] == "eventspec-cloud"

    s = final.stats
    edge_kids = Counter(c.name for c in children(spans, ask))
    for name in ("window + render", "uplink", "draft prefill", "drafting burst"):
        assert edge_kids[name] >= 1, (name, edge_kids)
    assert edge_kids["commit received"] == s.target_steps
    cloud_kids = children(spans, generate)
    names = Counter(c.name for c in cloud_kids)
    assert names["queue"] == names["prefill"] == names["Done"] == 1, names
    verify = [c for c in cloud_kids if c.name == "verify step"]
    prefill = next(c for c in cloud_kids if c.name == "prefill")
    assert len(verify) == s.target_steps - 1
    assert sum(int(c.attributes["eventspec.k"]) for c in [*verify, prefill]) == s.drafted
    assert sum(int(c.attributes["eventspec.accepted"]) for c in [*verify, prefill]) == s.accepted
    assert generate.attributes["eventspec.drafted"] == s.drafted
    assert ask.attributes["eventspec.finish_reason"] == final.finish_reason.name.lower()
    for child in [*cloud_kids, *children(spans, ask)]:
        assert child.start_time is not None and child.end_time is not None
        assert child.end_time >= child.start_time


def test_tracing_is_off_unless_the_environment_asks(mp: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        mp.delenv(name, raising=False)
    assert not tracing_requested()
    assert tracer_from_env("eventspec-cloud") is None
    assert tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
    assert not tracing_requested({"OTEL_TRACES_EXPORTER": "none",
                                  "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
    mp.setenv("OTEL_TRACES_EXPORTER", "console")
    assert tracer_from_env("eventspec-cloud") is not None
