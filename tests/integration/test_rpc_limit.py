"""Health and GetServerInfo answer however many streams wait for their first message
(issue 11's "48 Generate streams that never send Open" starved probes and status calls;
issue 19's stalled streams did the same through gRPC's own concurrent-RPC cap): a
call takes a slot of the concurrent-call limit only once its first message arrived."""

from __future__ import annotations

import asyncio

from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from tests.support import cloud_harness as ch
from tests.support import edge_harness as eh

BOUND_S = 2.0
SERVED_WITHIN_S = 30.0


async def test_streams_without_a_message_take_no_slot_and_probes_answer() -> None:
    target, _ = eh.shared_models()
    server = await ch.start_verifier(target, max_sessions=1)  # call limit 1 * 4 + 16 = 20
    assert server._host is not None
    limit = server._host.limit.limit
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            idle = [stub.Generate(timeout=30) for _ in range(3 * limit)]  # never send Open
            waiting = asyncio.gather(*(c.wait_for_connection() for c in idle))
            await asyncio.wait_for(waiting, timeout=10)
            assert server._host.limit.in_flight == 0
            # Each call's own deadline (BOUND_S) bounds it: exempt calls are answered.
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=BOUND_S)
            info = await stub.GetServerInfo(verifier_pb2.GetServerInfoRequest(), timeout=BOUND_S)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            assert info.model_id
            out = await ch.run_generate(server.port, ch.open_msg("What is moving?",
                                                                 ch.make_frames(1),
                                                                 max_new_tokens=4),
                                        timeout=SERVED_WITHIN_S)
            assert out.tokens
            for call in idle:
                call.cancel()
    finally:
        await server.stop(0)
