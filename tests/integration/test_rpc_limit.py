"""At the concurrent-call limit, health and GetServerInfo still answer (issue 11's
"48 Generate streams that never send Open" starved probes and status calls)."""

from __future__ import annotations

import asyncio
import time

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from tests.integration import cloud_harness as ch
from tests.integration import edge_harness as eh

BOUND_S = 2.0


async def test_health_and_server_info_answer_while_streams_hold_every_slot() -> None:
    target, _ = eh.shared_models()
    server = await ch.start_verifier(target, max_sessions=1)  # call limit 1 * 4 + 16 = 20
    assert server._host is not None
    limit = server._host.limit.limit
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            idle = [stub.Generate(timeout=30) for _ in range(limit)]  # never send Open
            deadline = time.monotonic() + 10
            while server._host.limit.in_flight < limit:
                assert time.monotonic() < deadline, server._host.limit.in_flight
                await asyncio.sleep(0.01)
            extra = stub.Generate(timeout=5)
            try:
                await extra.read()
                raise AssertionError("a call beyond the limit was served")
            except aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            t0 = time.monotonic()
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=BOUND_S)
            info = await stub.GetServerInfo(verifier_pb2.GetServerInfoRequest(), timeout=BOUND_S)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            assert info.model_id
            assert time.monotonic() - t0 < BOUND_S
            for call in idle:
                call.cancel()
            deadline = time.monotonic() + 10
            while server._host.limit.in_flight:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
    finally:
        await server.stop(0)
