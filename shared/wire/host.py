"""The gRPC server shell both nodes share: limits, error mapping, health, reflection.

Each node adds its own servicer to ``host.server``; this class owns the rest of the
lifecycle DESIGN asks of both: NOT_SERVING from bind until warm-up finishes, SERVING
after, NOT_SERVING again on shutdown, then ``stop(grace)``.
"""

from __future__ import annotations

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from shared.wire.interceptors import ErrorMappingInterceptor
from shared.wire.options import server_options

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


class GrpcHost:
    """A ``grpc.aio`` server for one node's service."""

    def __init__(self, service_name: str, *, max_message_bytes: int, max_rpcs: int) -> None:
        self.service_name = service_name
        self.server = aio.server(
            interceptors=[ErrorMappingInterceptor()],
            options=server_options(max_message_bytes),
            maximum_concurrent_rpcs=max_rpcs,
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (service_name, HEALTH_SERVICE, reflection.SERVICE_NAME), self.server
        )
        self.port = 0

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING or NOT_SERVING for the server and the node's service."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set("", status)
        await self.health.set(self.service_name, status)

    async def start(self, host: str, port: int) -> int:
        """Report NOT_SERVING, bind (``port`` 0 picks one) and start. Returns the port."""
        await self.set_serving(False)
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"could not bind {host}:{port}")
        await self.server.start()
        return self.port

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING, then stop, letting in-flight calls finish for ``grace_s``."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)

    async def wait(self) -> None:
        await self.server.wait_for_termination()
