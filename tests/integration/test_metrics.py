"""Prometheus metrics on both nodes, scraped over HTTP after real requests (issue 21).

A real cloud and a real edge on port 0, each with ``metrics_port=0``: a few speculative
and target-only Asks go through, then both ``/metrics`` endpoints are scraped and the
counters must have moved by exactly what the requests' Final statistics report
(drafts verified, accepted, hidden, target steps, tokens).
"""

from __future__ import annotations

import asyncio
import hashlib
import urllib.request
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.paced import PacedEngine
from eventspec.cloud.server import VerifierServer
from eventspec.edge.config import EdgeSettings
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.contract.types import AskSpec, FinalEvent, GenerationSettings, Mode
from tests.support import cloud_harness as ch
from tests.support import edge_harness as eh

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of ``http://127.0.0.1:PORT/metrics``, keyed by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return _parse(text)


def _parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: Samples, name: str) -> float:
    """The sum of ``name`` over all its label sets."""
    return sum(v for (n, _), v in samples.items() if n == name)


async def start_observed_stack() -> tuple[VerifierServer, EdgeServer]:
    """Cloud (paced, so drafts hide behind its prefill) and edge, both with metrics."""
    target, draft = eh.shared_models()
    engine = PacedEngine(HFEngine(target), prefill_ms=150.0, step_ms=20.0)
    cloud = VerifierServer(replace(ch.settings(max_sessions=4), metrics_port=0), target=target,
                           engine=engine, cost=eh.slow_cost(0.15, 0.02))
    await cloud.start()
    settings = replace(EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0,
                       metrics_port=0, speculation="always")
    edge = EdgeServer(settings, draft=draft)
    try:
        await edge.start()
    except BaseException:
        await cloud.stop(0)
        raise
    return cloud, edge


async def ask(port: int, question: str, mode: Mode) -> FinalEvent:
    async with EdgeClient(f"127.0.0.1:{port}", timeout_s=120) as client:
        return await client.ask_final(AskSpec(
            question, mode=mode, generation=GenerationSettings(max_new_tokens=12)))


async def test_counters_move_by_what_the_requests_report() -> None:
    cloud, edge = await start_observed_stack()
    try:
        assert cloud.metrics_port > 0 and edge.metrics_port > 0
        assert cloud.metrics_port != edge.metrics_port
        before_cloud = await asyncio.to_thread(scrape, cloud.metrics_port)
        assert value(before_cloud, "eventspec:kv_slots_total") >= 1
        assert value(before_cloud, "eventspec:kv_positions_total") >= value(
            before_cloud, "eventspec:kv_slots_total")
        finals = [
            await ask(edge.port, "What is moving?", Mode.SPECULATIVE),
            await ask(edge.port, "Which way does it go?", Mode.SPECULATIVE),
            await ask(edge.port, "What is moving?", Mode.TARGET_ONLY),
        ]
        c = await asyncio.to_thread(scrape, cloud.metrics_port)
        e = await asyncio.to_thread(scrape, edge.metrics_port)
    finally:
        await edge.stop(0)
        await cloud.stop(0)

    stats = [f.stats for f in finals]
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    steps = sum(s.target_steps for s in stats)
    assert drafted > 0, "speculation always: the cloud must have verified drafts"
    assert sum(s.hidden_drafted for s in stats) > 0, "a 150 ms prefill hides drafts"

    # The cloud: counters equal the sums of the requests' Done statistics.
    assert value(c, "eventspec:request_success_total", mode="speculative",
                 finished_reason=finals[0].finish_reason.name.lower()) >= 1
    assert total(c, "eventspec:request_success_total") == 3
    assert total(c, "eventspec:request_failure_total") == 0
    assert value(c, "eventspec:spec_decode_num_draft_tokens_total") == drafted
    assert value(c, "eventspec:spec_decode_num_accepted_tokens_total") == accepted
    assert total(c, "eventspec:spec_decode_num_accepted_tokens_per_pos_total") == accepted
    assert value(c, "eventspec:hidden_draft_tokens_total") == sum(s.hidden_drafted for s in stats)
    assert value(c, "eventspec:hidden_accepted_tokens_total") == sum(
        s.hidden_accepted for s in stats)
    assert value(c, "eventspec:target_steps_total") == steps
    assert value(c, "eventspec:generation_tokens_total") == sum(s.new_tokens for s in stats)
    assert value(c, "eventspec:stale_drafts_total") == sum(s.stale_drafts for s in stats)
    assert 0 < value(c, "eventspec:spec_decode_num_drafts_total") <= steps
    # Each request's first token comes from its prefill; every other step is batched,
    # so the batch sizes of all engine steps add up to the remaining per-request steps.
    assert value(c, "eventspec:iteration_batch_size_sum") == steps - 3
    assert value(c, "eventspec:drafts_received_total") >= 1
    assert value(c, "eventspec:draft_tokens_received_total") >= drafted
    for name in ("time_to_first_token_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "e2e_request_latency_seconds"):
        assert value(c, f"eventspec:{name}_count") == 3, name
    assert value(c, "eventspec:inter_token_latency_seconds_count") > 0
    assert value(c, "eventspec:requests_by_edge_total", edge="anonymous") == 3
    assert value(c, "eventspec:draft_tokens_by_edge_total", edge="anonymous") == drafted
    assert value(c, "eventspec:kv_slots_used") == 0
    assert value(c, "eventspec:kv_positions_used") == 0
    assert value(c, "eventspec:kv_cache_usage_perc") == 0
    assert value(c, "eventspec:num_requests_running") == 0

    # The edge: the same requests, counted from the Finals its clients were sent.
    assert value(e, "eventspec:edge_request_success_total", mode="speculative",
                 finished_reason=finals[0].finish_reason.name.lower()) >= 1
    assert total(e, "eventspec:edge_request_success_total") == 3
    assert value(e, "eventspec:edge_spec_decode_num_draft_tokens_total") == drafted
    assert value(e, "eventspec:edge_spec_decode_num_accepted_tokens_total") == accepted
    assert value(e, "eventspec:edge_hidden_accepted_tokens_total") == sum(
        s.hidden_accepted for s in stats)
    assert value(e, "eventspec:edge_uplink_bytes_total") == sum(s.uplink_bytes for s in stats)
    assert value(e, "eventspec:edge_drafts_sent_total") >= value(
        c, "eventspec:drafts_received_total")
    assert value(e, "eventspec:edge_draft_tokens_total") >= drafted
    assert value(e, "eventspec:edge_draft_time_per_token_seconds_count") == 2
    assert value(e, "eventspec:edge_uplink_seconds_count") == 3
    assert value(e, "eventspec:edge_plan_decisions_total", speculate="true",
                 reason="forced by --speculation always") + value(
        e, "eventspec:edge_plan_decisions_total", speculate="true", reason="speculate") == 2
    assert value(e, "eventspec:edge_plan_decisions_total", speculate="false",
                 reason="target-only request") == 1
    assert value(e, "eventspec:edge_cloud_rtt_seconds") > 0


async def test_refusals_are_counted_by_reason() -> None:
    server = VerifierServer(replace(ch.settings(), metrics_port=0),
                            target=eh.shared_models()[0], cost=ch.TEST_COST)
    await server.start()
    try:
        await ch.expect_failure(server.port, [ch.open_msg("   ", ch.make_frames(0))])
        samples = await asyncio.to_thread(scrape, server.metrics_port)
    finally:
        await server.stop(0)
    assert value(samples, "eventspec:request_failure_total", mode="speculative",
                 code="INVALID_ARGUMENT") == 1
    assert value(samples, "eventspec:sessions_rejected_total", reason="invalid") == 1


def test_metrics_are_off_by_default() -> None:
    assert ch.settings().metrics_port is None
    assert EdgeSettings().metrics_port is None
    assert EdgeSettings().metrics_host == "127.0.0.1"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_loopback_names(host: str) -> None:
    from eventspec.shared.node.metrics import is_loopback

    assert is_loopback(host)
    assert not is_loopback("0.0.0.0")


@pytest.mark.parametrize(("reason", "label"), [
    ("speculate: predicted 1.2x over target-only; 3 hidden drafts", "speculate"),
    ("no speculation: predicted 0.98x with 0 hidden drafts", "no speculation"),
    ("forced by --speculation always; the plan said: no speculation: ...",
     "forced by --speculation always"),
    ("target-only request: no drafts expected", "target-only request"),
])
def test_plan_reasons_become_a_few_label_values(reason: str, label: str) -> None:
    from eventspec.edge.metrics import plan_reason

    assert plan_reason(reason) == label


EDGE_A_TOKEN = "edge-a-token-0123456789abcdef"


async def start_cloud_with_token(principals: str = "name") -> VerifierServer:
    """A cloud on port 0 with metrics and one bearer token, named ``edge-a``."""
    from eventspec.shared.wire.security import ServerSecurity

    settings = replace(ch.settings(), metrics_port=0, metrics_principals=principals,
                       security=ServerSecurity(tokens=(("edge-a", EDGE_A_TOKEN),)))
    server = VerifierServer(settings, target=eh.shared_models()[0], cost=ch.TEST_COST)
    await server.start()
    return server


async def generate_as_edge_a(port: int) -> None:
    """One target-only Generate through the real stub, with edge-a's bearer token."""
    from grpc import aio

    from eventspec.shared.pb.eventspec.v1 import verifier_pb2_grpc

    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        call = stub.Generate(timeout=60,
                             metadata=(("authorization", f"Bearer {EDGE_A_TOKEN}"),))
        await call.write(ch.open_msg("What is moving?", ch.make_frames(0),
                                     max_new_tokens=4, speculative=False))
        while not (await call.read()).HasField("done"):
            pass
        await call.done_writing()


def scrape_text(port: int) -> str:
    """``/metrics`` as the text a scraper reads."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


async def test_auth_failures_and_per_edge_series_name_the_principal() -> None:
    import grpc
    from grpc import aio

    from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc

    server = await start_cloud_with_token()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            with pytest.raises(aio.AioRpcError) as refused:
                await stub.GetServerInfo(verifier_pb2.GetServerInfoRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await generate_as_edge_a(server.port)
        samples = await asyncio.to_thread(scrape, server.metrics_port)
    finally:
        await server.stop(0)
    assert value(samples, "eventspec:auth_failures_total", code="UNAUTHENTICATED") == 1
    assert value(samples, "eventspec:requests_by_edge_total", edge="edge-a") == 1
    assert total(samples, "eventspec:request_success_total") == 1


@pytest.mark.parametrize(("principals", "label"), [
    # What an operator computes by hand: printf %s edge-a | sha256sum | cut -c1-12
    ("hash", hashlib.sha256(b"edge-a").hexdigest()[:12]),
    ("none", "redacted"),
])
async def test_metrics_principals_keep_the_callers_name_off_metrics(
    principals: str, label: str,
) -> None:
    """Issue 38 (red-team finding 9): with --metrics-principals hash or none, the
    unauthenticated /metrics no longer says who calls, and the per-edge series still
    count that caller. The expected digest is computed here from the name alone, so a
    label salted per process (different after every restart) would fail too."""
    server = await start_cloud_with_token(principals)
    try:
        await generate_as_edge_a(server.port)
        text = await asyncio.to_thread(scrape_text, server.metrics_port)
    finally:
        await server.stop(0)
    assert "edge-a" not in text
    samples = _parse(text)
    edges = {dict(labels)["edge"] for (name, labels) in samples
             if name == "eventspec:requests_by_edge_total"}
    assert edges == {label}
    assert value(samples, "eventspec:requests_by_edge_total", edge=label) == 1
