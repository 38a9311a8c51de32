"""The gRPC server shell both nodes share: limits, security, error mapping, health, reflection.

Each node adds its own servicer to ``host.server``; this class owns the rest of the
lifecycle DESIGN asks of both: NOT_SERVING from bind until warm-up finishes, SERVING
after, NOT_SERVING again on shutdown, then ``stop(grace)``. Security (``ServerSecurity``)
is decided here too, once for both nodes: TLS or mutual TLS with certificates reloaded
on change or SIGHUP, the auth interceptor in front of everything but health, and the
start-up refusals (non-loopback without TLS and auth, busy port, port out of range).
While it serves, freed memory goes back to the system (``eventspec.shared.wire.heap``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from eventspec.shared.wire.auth import OPEN_METHODS, AuthInterceptor
from eventspec.shared.wire.gate import FIRST_MESSAGE_TIMEOUT_S, FirstMessageGate
from eventspec.shared.wire.heap import HeapTrimmer
from eventspec.shared.wire.interceptors import ErrorMappingInterceptor
from eventspec.shared.wire.limits import ConcurrencyLimitInterceptor
from eventspec.shared.wire.options import server_options
from eventspec.shared.wire.reflection import enable_reflection
from eventspec.shared.wire.refusals import RefusalBudgetInterceptor
from eventspec.shared.wire.request_guard import RequestGuardInterceptor
from eventspec.shared.wire.security import SecurityConfigError, ServerSecurity, check_server_start
from eventspec.shared.wire.tls import ReloadingServerCredentials

log = logging.getLogger(__name__)

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
#: The health port takes only HealthCheckRequests, which are tiny, and quickly.
HEALTH_MAX_MESSAGE_BYTES = 4096
HEALTH_FIRST_MESSAGE_TIMEOUT_S = 5.0


def _address(host: str, port: int) -> str:
    bare_v6 = ":" in host and not host.startswith("[")
    return f"[{host}]:{port}" if bare_v6 else f"{host}:{port}"


class GrpcHost:
    """A ``grpc.aio`` server for one node's service."""

    def __init__(self, service_name: str, *, max_message_bytes: int, max_rpcs: int,
                 security: ServerSecurity | None = None,
                 unlimited_methods: frozenset[str] = frozenset(),
                 first_message_timeout_s: float = FIRST_MESSAGE_TIMEOUT_S,
                 max_receive_bytes: int | None = None) -> None:
        """``max_rpcs`` caps concurrent calls except health and ``unlimited_methods``
        (cheap status calls such as GetServerInfo), which stay answerable at the cap.

        The cap counts only calls whose first request message has arrived: every call
        gets ``first_message_timeout_s`` from its HEADERS to send it (``FirstMessageGate``),
        an unauthenticated one is refused at HEADERS, and each connection holds at most
        ``MAX_STREAMS_PER_CONNECTION`` streams. gRPC's own ``maximum_concurrent_rpcs``
        is not used: it counts stalled streams too, which let one client lock every
        caller out (issue 19).

        ``max_receive_bytes`` caps request messages below ``max_message_bytes``, for a
        node whose requests are all small (the edge): gRPC refuses a larger one from its
        length prefix, so a flood of them never reaches Python (issue 38).
        """
        self.service_name = service_name
        self.security = security or ServerSecurity()
        #: Outermost: a connection with too many refused calls is cut off
        #: (``eventspec.shared.wire.refusals``) before anything else runs for its calls.
        self.refusals = RefusalBudgetInterceptor()
        interceptors: list[aio.ServerInterceptor] = [self.refusals]
        #: The auth interceptor, when callers must authenticate (its ``on_denied`` hook
        #: counts refusals in the nodes' metrics).
        self.auth = AuthInterceptor(self.security) if self.security.requires_auth else None
        if self.auth is not None:
            interceptors.append(self.auth)
        self.limit = ConcurrencyLimitInterceptor(max_rpcs, unlimited_methods)
        # The request guard innermost: its check on a request's bytes runs before the
        # parse, and the error mapping outside it turns a refusal into the call's status.
        #: Health, open to anyone, is read a few calls at a time per connection.
        self.gate = FirstMessageGate(first_message_timeout_s, open_methods=OPEN_METHODS)
        interceptors += [self.gate, self.limit,
                         ErrorMappingInterceptor(), RequestGuardInterceptor()]
        self.credentials = (
            ReloadingServerCredentials(self.security.tls) if self.security.tls else None
        )
        self.server = aio.server(
            interceptors=interceptors,
            options=server_options(max_message_bytes, max_receive_bytes),
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if self.security.reflection:
            enable_reflection(self.server, (service_name, HEALTH_SERVICE))
        #: Returns the memory calls freed (a refused 4 MiB request's) to the system.
        self.trimmer = HeapTrimmer()
        self.port = 0
        self.health_port: int | None = None
        self._health_server: aio.Server | None = None
        self._sighup = False

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING or NOT_SERVING for the server and the node's service."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set("", status)
        await self.health.set(self.service_name, status)

    async def start(self, host: str, port: int, health_port: int | None = None) -> int:
        """Check the security rules, report NOT_SERVING, bind and start. Returns the port.

        ``port`` 0 picks one. A busy port is an error (SO_REUSEPORT is off), and so is a
        non-loopback ``host`` without TLS and authentication unless ``insecure``. With
        ``health_port`` (0 picks one; bound port in ``self.health_port``), grpc.health.v1
        is also served alone there (``_start_health_server``).
        """
        check_server_start(host, port, self.security)
        if health_port is not None and not 0 <= health_port <= 65535:
            raise SecurityConfigError(
                f"--health-port {health_port} is out of range: use 0..65535 (0 picks one)")
        await self.set_serving(False)
        address = _address(host, port)
        try:
            if self.credentials is not None:
                self.port = self.server.add_secure_port(address, self.credentials.credentials())
            else:
                self.port = self.server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(
                f"cannot listen on {address}: the port is in use or the address is not "
                "available on this machine (--host/--port)"
            ) from exc
        if health_port is not None:
            await self._start_health_server(host, health_port)
        await self.server.start()
        self.trimmer.start()
        self._watch_sighup()
        log.info("listening on %s:%d (%s, %s, reflection %s)", host, self.port,
                 "mutual TLS" if self.security.tls and self.security.tls.client_auth == "require"
                 else "TLS" if self.security.tls else "plaintext",
                 "authenticated" if self.security.requires_auth else "anonymous callers",
                 "on" if self.security.reflection else "off")
        return self.port

    async def _start_health_server(self, host: str, port: int) -> None:
        """grpc.health.v1 alone, on its own server: probes (Kubernetes' native gRPC probe
        speaks plaintext) reach it whatever holds the main port's calls, streams or
        connections. It reports the same status (one ``HealthServicer``), takes no
        credentials (as health on the main port), small messages and few streams."""
        server = aio.server(
            interceptors=[FirstMessageGate(HEALTH_FIRST_MESSAGE_TIMEOUT_S),
                          ErrorMappingInterceptor()],
            options=server_options(HEALTH_MAX_MESSAGE_BYTES),
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        address = _address(host, port)
        try:
            self.health_port = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise OSError(
                f"cannot listen on {address}: the port is in use or the address is not "
                "available on this machine (--host/--health-port)"
            ) from exc
        await server.start()
        self._health_server = server
        log.info("health (grpc.health.v1 only, plaintext) on %s:%d", host, self.health_port)

    def reload_tls(self) -> None:
        """Re-read the TLS files at the next handshake (also done on SIGHUP)."""
        if self.credentials is not None:
            log.info("reloading TLS certificates")
            self.credentials.request_reload()
        else:
            log.info("SIGHUP: no TLS configured, nothing to reload")

    def _watch_sighup(self) -> None:
        """SIGHUP reloads certificates (``systemctl reload``); it must never kill the
        server, so the handler is installed with or without TLS."""
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload_tls)
            self._sighup = True

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING, then stop, letting in-flight calls finish for ``grace_s``."""
        if self._sighup:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
        await self.trimmer.stop()
        if self._health_server is not None:
            await self._health_server.stop(0)
            self._health_server = None

    async def wait(self) -> None:
        await self.server.wait_for_termination()
