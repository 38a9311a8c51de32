"""One server interceptor that maps domain exceptions to gRPC statuses.

Servicers raise ``shared.errors.EventSpecError`` subclasses (or let them bubble up from
the pure logic); this interceptor turns them into ``context.abort(code, message)`` for
unary and streaming RPCs alike, so the client always sees a clear status, never a hang.
Unexpected exceptions become INTERNAL with the exception's type, and are logged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from shared.errors import EventSpecError, WarmingUp
from shared.wire.handlers import wrap_handler
from shared.wire.status import to_grpc

log = logging.getLogger(__name__)

#: Trailing metadata key on UNAVAILABLE from a server that is warming up: its phase
#: ("calibrating, round 2 of 3"), so a client tells "warming" from "down".
WARMING_UP_KEY = "eventspec-warming-up"


async def _abort_for(exc: BaseException, context: aio.ServicerContext[Any, Any]) -> None:
    if isinstance(exc, WarmingUp):
        await context.abort(to_grpc(exc.code), exc.message,
                            trailing_metadata=((WARMING_UP_KEY, exc.phase),))
    if isinstance(exc, EventSpecError):
        await context.abort(to_grpc(exc.code), exc.message)
    if isinstance(exc, DecodeError):  # the peer sent bytes that are not the request type
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request message: {exc}")
    log.exception("unhandled error in RPC", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


@contextlib.asynccontextmanager
async def _mapped(context: aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
    try:
        yield
    except aio.AbortError:
        raise
    except Exception as exc:
        await _abort_for(exc, context)


class ErrorMappingInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Map ``EventSpecError`` to its gRPC status for every RPC kind."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return wrap_handler(handler, _mapped)
