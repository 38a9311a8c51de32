"""A concurrent-call limit that leaves health and cheap status calls answerable.

gRPC's ``maximum_concurrent_rpcs`` counts every call from its HEADERS, so streams that
hold their slot (a Generate that never sends Open, a request message never finished)
also shut out health checks and GetServerInfo: probes fail and load balancers drop a
server that is merely busy. This interceptor applies the limit to the node's work only,
and it sits inside ``eventspec.shared.wire.gate.FirstMessageGate``, so it counts only calls whose
first message has arrived; the exempt methods are cheap and bounded. gRPC's own limit
is not used (``eventspec.shared.wire.host``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio

from eventspec.shared.wire.handlers import MethodInterceptor, wrap_handler

log = logging.getLogger(__name__)

#: Always answerable: probes and client-side health checking.
HEALTH_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})


class ConcurrencyLimitInterceptor(MethodInterceptor):
    """RESOURCE_EXHAUSTED beyond ``limit`` concurrent calls, except ``exempt`` methods."""

    def __init__(self, limit: int, exempt: frozenset[str]) -> None:
        if limit < 1:
            raise ValueError(f"the concurrent-call limit must be >= 1, got {limit}")
        self.limit = limit
        self.exempt = HEALTH_METHODS | exempt
        self.in_flight = 0

    def wrap(self, handler: grpc.RpcMethodHandler,
             call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = call.method
        if method in self.exempt:
            return handler

        @contextlib.asynccontextmanager
        async def slot(context: aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
            if self.in_flight >= self.limit:
                log.warning("RESOURCE_EXHAUSTED %s from %s: %d calls in flight", method,
                            context.peer(), self.in_flight)
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    "the server is busy (too many concurrent calls); retry later")
            self.in_flight += 1
            try:
                yield
            finally:
                self.in_flight -= 1

        return wrap_handler(handler, slot)
