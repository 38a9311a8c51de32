"""No stream can starve either node (issue 19, item 1): 10 connections keep 100 streams
each open with HEADERS and part of a request message, never finished, answering pings,
with and without TLS and tokens. Meanwhile health answers (on the main port and on
the separate ``--health-port``), and authenticated
GetServerInfo / GetStatus, Generate and Ask are served. Before the fix every one of
them got ``RESOURCE_EXHAUSTED: Concurrent RPC limit exceeded!``.

Speed goals belong in benchmarks; here each answer must come within a generous bound
(CI's machine is busy), and the health latencies are reported."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eventspec.cloud.server import VerifierServer
from eventspec.edge.config import EdgeSettings
from eventspec.edge.server import EdgeServer
from eventspec.shared.contract import convert_ask, convert_verifier
from eventspec.shared.contract.types import AskSpec, DoneEvent, GenerationSettings, Mode
from eventspec.shared.pb.eventspec.v1 import (
    edge_pb2,
    edge_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)
from eventspec.shared.wire.channel import call_metadata, open_channel
from eventspec.shared.wire.security import ClientSecurity, ServerSecurity
from tests.support import cloud_harness as ch
from tests.support import edge_harness as eh
from tests.support import tls_harness as th
from tests.support.h2_slowloris import Slowloris

log = logging.getLogger(__name__)

#: Generous: every call below must be answered, not refused, within this.
ANSWER_WITHIN_S = 30.0
CLOUD_METHODS = ("/eventspec.v1.Verifier/GetServerInfo", "/grpc.health.v1.Health/Check",
                 "/eventspec.v1.Verifier/Generate")
EDGE_METHODS = ("/eventspec.v1.EdgeAgent/Ask", "/eventspec.v1.EdgeAgent/GetStatus",
                "/grpc.health.v1.Health/Check")


@dataclass
class Node:
    port: int
    client: ClientSecurity | None
    ca: Path | None


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> th.Pki:
    return th.make_pki(tmp_path_factory.mktemp("pki"))


def _security(pki: th.Pki, tls: bool, tmp: Path) -> tuple[ServerSecurity, ClientSecurity | None]:
    if not tls:
        return ServerSecurity(), None
    tokens = th.write_tokens(tmp / "tokens", edge_a=th.TOKEN_A)
    return th.server_security(pki, token_file=tokens), th.client_security(pki, token=th.TOKEN_A)


async def _health(node: Node) -> float:
    t0 = time.monotonic()
    async with open_channel(f"127.0.0.1:{node.port}", node.client) as channel:
        resp = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=ANSWER_WITHIN_S)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    return time.monotonic() - t0


async def _generate(node: Node) -> DoneEvent:
    async with open_channel(f"127.0.0.1:{node.port}", node.client) as channel:
        call = verifier_pb2_grpc.VerifierStub(channel).Generate(
            timeout=ANSWER_WITHIN_S, metadata=call_metadata(node.client))
        await call.write(ch.open_msg("What is moving?", ch.make_frames(1), max_new_tokens=4,
                                     speculative=False))
        while True:
            msg = await call.read()
            assert msg is not aio.EOF
            event = convert_verifier.cloud_message_from_pb(msg)
            if isinstance(event, DoneEvent):
                await call.done_writing()
                return event


async def _ask(node: Node) -> int:
    spec = AskSpec("What is moving?", mode=Mode.TARGET_ONLY,
                   generation=GenerationSettings(max_new_tokens=4))
    tokens = 0
    async with open_channel(f"127.0.0.1:{node.port}", node.client) as channel:
        call = edge_pb2_grpc.EdgeAgentStub(channel).Ask(
            convert_ask.ask_spec_to_pb(spec), timeout=ANSWER_WITHIN_S,
            metadata=call_metadata(node.client))
        async for msg in call:
            if msg.HasField("final"):
                tokens = len(msg.final.token_ids)
    return tokens


@pytest.fixture(params=[False, True], ids=["plaintext", "tls-tokens"])
def tls(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


async def _attack(node: Node, methods: tuple[str, ...]) -> AsyncIterator[Slowloris]:
    attack = Slowloris("127.0.0.1", node.port, methods, ca=node.ca)
    await attack.start()
    try:
        yield attack
    finally:
        await attack.stop()


async def test_cloud_serves_during_a_slowloris(pki: th.Pki, tls: bool, tmp_path: Path) -> None:
    target, _ = eh.shared_models()
    server_sec, client_sec = _security(pki, tls, tmp_path)
    cloud = VerifierServer(replace(ch.settings(max_sessions=4), security=server_sec,
                                   health_port=0), target=target, cost=ch.TEST_COST)
    await cloud.start()
    node = Node(cloud.port, client_sec, pki.ca if tls else None)
    assert cloud._host is not None and cloud._host.health_port
    probe_port = Node(cloud._host.health_port, None, None)
    try:
        async for attack in _attack(node, CLOUD_METHODS):
            health = [await _health(node) for _ in range(5)]
            probes = [await _health(probe_port) for _ in range(5)]
            async with open_channel(f"127.0.0.1:{node.port}", node.client) as channel:
                info = await verifier_pb2_grpc.VerifierStub(channel).GetServerInfo(
                    verifier_pb2.GetServerInfoRequest(), timeout=ANSWER_WITHIN_S,
                    metadata=call_metadata(node.client))
            assert info.model_id
            done = await _generate(node)
            assert done.token_ids
            log.info("cloud (%s): %d stalled streams opened, ended %s; health %s s, "
                     "health port %s s", "TLS" if tls else "plaintext", attack.opened,
                     dict(attack.ended), [round(h, 3) for h in health],
                     [round(h, 3) for h in probes])
            assert attack.opened >= 900, attack.opened
    finally:
        await cloud.stop(0)


async def test_edge_serves_during_a_slowloris(pki: th.Pki, tls: bool, tmp_path: Path) -> None:
    target, draft = eh.shared_models()
    cloud = await ch.start_verifier(target, max_sessions=4)
    server_sec, client_sec = _security(pki, tls, tmp_path)
    edge = EdgeServer(replace(EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0,
                              security=server_sec, health_port=0), draft=draft)
    await edge.start()
    node = Node(edge.port, client_sec, pki.ca if tls else None)
    assert edge._host is not None and edge._host.health_port
    probe_port = Node(edge._host.health_port, None, None)
    try:
        async for attack in _attack(node, EDGE_METHODS):
            health = [await _health(node) for _ in range(5)]
            probes = [await _health(probe_port) for _ in range(5)]
            async with open_channel(f"127.0.0.1:{node.port}", node.client) as channel:
                status = await edge_pb2_grpc.EdgeAgentStub(channel).GetStatus(
                    edge_pb2.GetStatusRequest(), timeout=ANSWER_WITHIN_S,
                    metadata=call_metadata(node.client))
            assert status.serving
            assert await _ask(node) > 0
            log.info("edge (%s): %d stalled streams opened, ended %s; health %s s, "
                     "health port %s s", "TLS" if tls else "plaintext", attack.opened,
                     dict(attack.ended), [round(h, 3) for h in health],
                     [round(h, 3) for h in probes])
            assert attack.opened >= 900, attack.opened
    finally:
        await edge.stop(0)
        await cloud.stop(0)
