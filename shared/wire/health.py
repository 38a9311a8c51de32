"""Client-side health polling: wait until a server reports SERVING on grpc.health.v1,
and say why it does not yet (``eventspec wait``, the demo and the tests use it)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eventspec.shared.pb.eventspec.v1 import (
    edge_pb2,
    edge_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)
from eventspec.shared.wire.channel import Metadata, call_metadata, open_channel
from eventspec.shared.wire.interceptors import WARMING_UP_KEY
from eventspec.shared.wire.security import ClientSecurity


async def not_serving_reason(channel: aio.Channel, metadata: Metadata = ()) -> str:
    """What a NOT_SERVING eventspec node says it is doing: a warming cloud's phase (from
    GetServerInfo's trailing metadata) or an edge's ``not_serving_reason`` (GetStatus).
    Empty when the server says nothing (not ours, or it needs a token we lack)."""
    try:
        await verifier_pb2_grpc.VerifierStub(channel).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=2, metadata=metadata)
    except aio.AioRpcError as exc:
        for key, value in exc.trailing_metadata() or ():
            if key == WARMING_UP_KEY:
                return f"cloud verifier warming up: {value}"
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            return ""
    else:
        return ""
    try:
        status = await edge_pb2_grpc.EdgeAgentStub(channel).GetStatus(
            edge_pb2.GetStatusRequest(), timeout=2, metadata=metadata)
    except aio.AioRpcError:
        return ""
    return str(status.not_serving_reason)


async def wait_for_serving(address: str, timeout_s: float = 60.0, service: str = "",
                           security: ClientSecurity | None = None,
                           on_reason: Callable[[str], None] | None = None) -> None:
    """Poll grpc.health.v1 at ``address`` until SERVING.

    Health needs no token, but a TLS port needs ``security`` (and a mutual-TLS port a
    client certificate) for the handshake. ``on_reason`` hears each new reason the
    server gives for not serving yet (or "unreachable: ..." while nothing answers).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last = ""
    async with open_channel(address, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            reason = ""
            try:
                resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                if on_reason is not None:
                    reason = (await not_serving_reason(channel, call_metadata(security))
                              or "NOT_SERVING")
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, aio.AioRpcError) else None
                reason = f"unreachable ({code.name if code else 'no answer'})"
            if on_reason is not None and reason and reason != last:
                on_reason(reason)
            last = reason or last
            if loop.time() > deadline:
                why = f" (last: {last})" if last else ""
                raise TimeoutError(
                    f"{address} did not report SERVING within {timeout_s:.0f} s{why}")
            await asyncio.sleep(0.1 if on_reason is None else 0.25)
