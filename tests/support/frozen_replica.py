"""A cloud replica that can freeze and thaw: a real grpc.aio server on port 0.

Thawed, it forwards every Verifier call to a real verifier (``upstream``), so Asks sent
through it get real answers. Frozen, it accepts calls and says nothing: GetServerInfo
and Generate wait for the thaw, while ``grpc.health.v1`` keeps reporting SERVING and
HTTP/2 keepalive is answered. That is a replica whose handlers hang, or one that was
SIGSTOPped, between keepalive pings: the edge's channel still takes it for healthy.

Used by ``tests/integration/test_frozen_replica.py`` and by
``benchmarks/bench_frozen_replica.py --freeze hang``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc

VERIFIER_SERVICE = "eventspec.v1.Verifier"


class FreezableReplica(verifier_pb2_grpc.VerifierServicer):
    """``await start()`` (returns the port), ``freeze()``, ``thaw()``, ``await stop()``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._server: aio.Server | None = None
        self._channel: aio.Channel | None = None
        self._stub: verifier_pb2_grpc.VerifierStub | None = None
        #: Generate calls that reached it (frozen or not), and those it answered.
        self.opened = 0
        self.forwarded = 0

    def freeze(self) -> None:
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    async def start(self) -> int:
        self._channel = aio.insecure_channel(self.upstream)
        self._stub = verifier_pb2_grpc.VerifierStub(self._channel)
        server = aio.server()
        verifier_pb2_grpc.add_VerifierServicer_to_server(self, server)
        checks = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(checks, server)
        await checks.set(VERIFIER_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        return int(port)

    async def stop(self) -> None:
        self.thaw()
        if self._server is not None:
            await self._server.stop(0)
        if self._channel is not None:
            await self._channel.close()

    async def GetServerInfo(self, request: Any, context: Any) -> verifier_pb2.ServerInfo:
        await self._thawed.wait()
        assert self._stub is not None
        try:
            return await self._stub.GetServerInfo(request, timeout=context.time_remaining())
        except aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
            raise

    async def Generate(self, request_iterator: Any, context: Any
                       ) -> AsyncIterator[verifier_pb2.CloudMessage]:
        self.opened += 1
        await self._thawed.wait()
        self.forwarded += 1
        assert self._stub is not None
        call = self._stub.Generate(timeout=context.time_remaining())
        pump = asyncio.create_task(_pump(request_iterator, call))
        try:
            async for reply in call:
                yield reply
        except aio.AioRpcError as exc:
            await context.abort(exc.code(), exc.details() or "")
        finally:
            pump.cancel()
            call.cancel()


async def _pump(requests: Any, call: Any) -> None:
    """The edge's messages on to the upstream call, then its half-close."""
    async for msg in requests:
        await call.write(msg)
    await call.done_writing()
