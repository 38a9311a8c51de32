"""Client-side health polling: wait until a server reports SERVING on grpc.health.v1."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.wire.channel import open_channel
from shared.wire.security import ClientSecurity


async def wait_for_serving(address: str, timeout_s: float = 60.0, service: str = "",
                           security: ClientSecurity | None = None) -> None:
    """Poll grpc.health.v1 at ``address`` until SERVING (used by the demo and tests).

    Health needs no token, but a TLS port needs ``security`` (and a mutual-TLS port a
    client certificate) for the handshake.
    """
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with open_channel(address, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{address} did not report SERVING within {timeout_s:.0f} s")
            await asyncio.sleep(0.1)
