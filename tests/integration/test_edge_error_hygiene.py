"""What an Ask caller learns when the cloud fails: the status and what happened, never
the cloud's internal address or an operator's hint; the edge's log keeps the detail."""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import grpc
import pytest
from grpc import aio

from eventspec.edge.config import EdgeSettings
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract import convert_ask
from eventspec.shared.contract.types import AskSpec, Mode
from eventspec.shared.node.logsafe import scrub_addresses, scrub_operator_hints
from eventspec.shared.pb.eventspec.v1 import edge_pb2, edge_pb2_grpc, verifier_pb2_grpc
from tests.support import cloud_harness as ch
from tests.support import edge_harness as eh
from tests.support.ports import refusing_port

HOST_PORT = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}:\d+|localhost:\d+|\[[0-9a-f:]+\]:\d+")


@pytest.mark.parametrize("cloud_host", ["127.0.0.1", "localhost"])
async def test_ask_against_a_dead_cloud_hides_the_address_but_logs_it(
    cloud_host: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, draft = eh.shared_models()
    with refusing_port() as port:
        cloud = f"{cloud_host}:{port}"
        edge = EdgeServer(replace(EdgeSettings(), cloud=cloud, port=0, rpc_timeout_s=2.0),
                          draft=draft)
        await edge.start()
        try:
            spec = AskSpec("What is moving?", mode=Mode.TARGET_ONLY)
            with caplog.at_level(logging.WARNING, logger="eventspec.edge"):
                async with aio.insecure_channel(f"127.0.0.1:{edge.port}") as channel:
                    call = edge_pb2_grpc.EdgeAgentStub(channel).Ask(
                        convert_ask.ask_spec_to_pb(spec), timeout=30)
                    with pytest.raises(aio.AioRpcError) as err:
                        async for _ in call:
                            pass
                    status = await edge_pb2_grpc.EdgeAgentStub(channel).GetStatus(
                        edge_pb2.GetStatusRequest(), timeout=10)
            details = err.value.details() or ""
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "unreachable" in details, details
            assert not HOST_PORT.search(details), details
            assert "--" not in details, details  # no flag hints for the operator
            assert not HOST_PORT.search(status.link.last_error), status.link.last_error
            assert cloud in caplog.text  # the operator's copy names the cloud
        finally:
            await edge.stop(0)


@pytest.mark.parametrize("text", [
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.1.2.3:50061: refused",
    "cloud 10.1.2.3:50061 unreachable",
    "dns:///verifier.ns.svc.cluster.local:50061 failed",
    "ipv6:[fd00::1]:50061: Connection refused",
    "peer 10.0.0.7 reset the stream",
])
def test_scrub_addresses_leaves_no_address(text: str) -> None:
    out = scrub_addresses(text)
    assert "<address>" in out
    assert not re.search(r"\d+\.\d+\.\d+\.\d+|:\d{4,5}\b|cluster\.local", out), out


def test_scrub_addresses_keeps_plain_messages() -> None:
    text = "frame 3: image of 9000x10 has aspect ratio 900.0, over the cap of 4"
    assert scrub_addresses(text) == text


@pytest.mark.parametrize(("text", "kept"), [
    ("the verifier is at its cap of 8 concurrent sessions; retry later or raise "
     "--max-sessions", "the verifier is at its cap of 8 concurrent sessions; retry later"),
    ("principal 'edge-a' already holds 2 concurrent sessions, the per-principal cap "
     "(--max-sessions-per-principal 2); retry when one ends",
     "principal 'edge-a' already holds 2 concurrent sessions, the per-principal cap; retry "
     "when one ends"),
    ("all 3 KV slots are in use (3 slots x 512 tokens, GetServerInfo.limits.kv_slots); "
     "retry later or raise --kv-cache-gb",
     "all 3 KV slots are in use (3 slots x 512 tokens, GetServerInfo.limits.kv_slots); "
     "retry later"),
    ("no slot fits; raise --kv-cache-gb or lower --max-seq-len", "no slot fits"),
    ("all 3 KV slots are in use (3 slots x 512 tokens, GetServerInfo.limits.kv_slots), and "
     "the queue of 64 requests waiting for KV is full (--kv-queue); retry later",
     "all 3 KV slots are in use (3 slots x 512 tokens, GetServerInfo.limits.kv_slots), and "
     "the queue of 64 requests waiting for KV is full; retry later"),
    ("all 3 KV slots are in use (3 slots x 512 tokens, GetServerInfo.limits.kv_slots); waited "
     "30 s in line for KV (the shorter of --kv-wait-s and the request's deadline); retry "
     "later",
     "all 3 KV slots are in use (3 slots x 512 tokens, GetServerInfo.limits.kv_slots); waited "
     "30 s in line for KV; retry later"),
    ("max_new_tokens 33 exceeds this server's cap of 32",
     "max_new_tokens 33 exceeds this server's cap of 32"),
])
def test_operator_hints_are_dropped_and_the_message_kept(text: str, kept: str) -> None:
    assert scrub_operator_hints(text) == kept


async def test_a_full_cloud_tells_the_asker_it_is_full_without_the_operators_flag(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cloud's refusal ("retry later or raise --max-sessions") reaches the Ask caller
    as RESOURCE_EXHAUSTED without the flag, once the edge's retries (for up to
    --cloud-wait-s, 1 s here) find it still full; the edge's log keeps the cloud's words."""
    target, draft = eh.shared_models()
    cloud = await ch.start_verifier(target, max_sessions=1)
    edge = EdgeServer(replace(EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0,
                              cloud_wait_s=1.0), draft=draft)
    await edge.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{cloud.port}") as direct:
            call = verifier_pb2_grpc.VerifierStub(direct).Generate(timeout=30)
            await call.write(ch.open_msg("Holding?", ch.make_frames(1), max_new_tokens=32))
            assert (await call.read()).HasField("plan")  # the only session is taken
            spec = AskSpec("What is moving?", mode=Mode.TARGET_ONLY)
            with caplog.at_level(logging.WARNING, logger="eventspec.edge"):
                async with aio.insecure_channel(f"127.0.0.1:{edge.port}") as channel:
                    ask = edge_pb2_grpc.EdgeAgentStub(channel).Ask(
                        convert_ask.ask_spec_to_pb(spec), timeout=30)
                    with pytest.raises(aio.AioRpcError) as err:
                        async for _ in ask:
                            pass
            call.cancel()
        details = err.value.details() or ""
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "cap of 1 concurrent sessions" in details, details
        assert "--" not in details, details
        assert "raise --max-sessions" in caplog.text  # the operator's copy keeps the hint
    finally:
        await edge.stop(0)
        await cloud.stop(0)


async def test_the_client_blames_the_cloud_not_the_edge_when_the_cloud_is_down() -> None:
    """The edge answered with "cloud verifier: ... unreachable": `eventspec ask` used to
    say it could not reach the edge agent, which sent users to debug the wrong hop."""
    _, draft = eh.shared_models()
    with refusing_port() as port:
        edge = EdgeServer(replace(EdgeSettings(), cloud=f"127.0.0.1:{port}", port=0,
                                  rpc_timeout_s=2.0), draft=draft)
        await edge.start()
        try:
            async with EdgeClient(f"127.0.0.1:{edge.port}", timeout_s=30) as client:
                with pytest.raises(AskError) as err:
                    await client.ask_final(AskSpec("What is moving?", mode=Mode.TARGET_ONLY))
            text = str(err.value)
            assert err.value.code == grpc.StatusCode.UNAVAILABLE
            assert f"the edge agent at 127.0.0.1:{edge.port} cannot use its cloud verifier" in text
            assert "cannot reach the edge agent" not in text
        finally:
            await edge.stop(0)
