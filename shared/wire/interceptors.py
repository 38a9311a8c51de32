"""One server interceptor that maps domain exceptions to gRPC statuses.

Servicers raise ``eventspec.shared.contract.errors.EventSpecError`` subclasses (or let
them bubble up from the pure logic); this interceptor turns them into ``context.abort(code,
message)`` for unary and streaming RPCs alike, so the client always sees a clear status, never a
hang. Unexpected exceptions become INTERNAL with the exception's type, and are logged.

Bytes that do not parse as the request message are INVALID_ARGUMENT on every method. For
a streaming request the parse happens inside the handler (as its iterator is read), so
the mapping below sees the ``DecodeError``; for a single request message gRPC parses it
before calling the handler and would answer UNKNOWN ("Unexpected <class
'DecodeError'>"), so that parse is wrapped to hand the handler a marker instead. The
same marker carries a refusal raised before the parse, by a check on the request's bytes
(``eventspec.shared.wire.request_guard``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from eventspec.shared.contract.errors import EventSpecError, WarmingUp
from eventspec.shared.wire.handlers import (
    FACTORIES,
    Behaviour,
    MethodInterceptor,
    forget_frames,
    wrap_handler,
)
from eventspec.shared.wire.refusals import mark_refused
from eventspec.shared.wire.status import to_grpc

log = logging.getLogger(__name__)

#: Trailing metadata key on UNAVAILABLE from a server that is warming up: its phase
#: ("calibrating, round 2 of 3"), so a client tells "warming" from "down".
WARMING_UP_KEY = "eventspec-warming-up"


#: The longest status message sent: an error that echoes a caller's field (a tensor's
#: name, a stop string) could otherwise exceed gRPC's metadata limit and come back as
#: RESOURCE_EXHAUSTED instead of its own code (issue 38, red-team finding 8).
MAX_DETAILS_CHARS = 1024


def bounded_details(message: str, limit: int = MAX_DETAILS_CHARS) -> str:
    """``message`` cut in its middle to ``limit`` characters or about that: the start
    names the field, the end often the limit it broke."""
    if len(message) <= limit:
        return message
    keep = limit // 2 - 20
    cut = len(message) - 2 * keep
    return f"{message[:keep]} … ({cut} characters cut) … {message[-keep:]}"


def _malformed(method: str, exc: DecodeError) -> str:
    return f"{method.rsplit('/', 1)[-1]}: malformed request message: {exc}"


async def _abort_for(exc: BaseException, context: aio.ServicerContext[Any, Any],
                     method: str) -> None:
    if isinstance(exc, WarmingUp):
        await context.abort(to_grpc(exc.code), bounded_details(exc.message),
                            trailing_metadata=((WARMING_UP_KEY, bounded_details(exc.phase)),))
    if isinstance(exc, EventSpecError):
        await context.abort(to_grpc(exc.code), bounded_details(exc.message))
    if isinstance(exc, DecodeError):  # the peer sent bytes that are not the request type
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            bounded_details(_malformed(method, exc)))
    log.exception("unhandled error in RPC", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL,
                        bounded_details(f"internal error: {type(exc).__name__}: {exc}"))


class Undecodable:
    """What a single-message handler receives instead of bytes that did not parse, or
    that a check on the bytes refused before parsing (an ``EventSpecError``)."""

    def __init__(self, error: DecodeError | EventSpecError) -> None:
        self.error = error


def tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserialize`` returning an ``Undecodable`` marker instead of raising, so the
    handler (which then refuses it with INVALID_ARGUMENT, or the refusal's own status)
    runs instead of gRPC's UNKNOWN."""
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (DecodeError, EventSpecError) as exc:
            return Undecodable(forget_frames(exc))  # its frames hold ``data``

    return parse


def _refusing_undecodable(fn: Behaviour, method: str) -> Behaviour:
    """``fn`` (a single-request behaviour) that first refuses an ``Undecodable`` request."""
    if inspect.isasyncgenfunction(fn):

        async def gen(request: Any, context: aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            if isinstance(request, Undecodable):
                mark_refused()
                await _abort_for(request.error, context, method)
            async for item in fn(request, context):
                yield item

        return gen

    async def coro(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Undecodable):
            mark_refused()
            await _abort_for(request.error, context, method)
        return await fn(request, context)

    return coro


class ErrorMappingInterceptor(MethodInterceptor):
    """Map ``EventSpecError`` (and undecodable requests) to a gRPC status for every RPC
    kind. Install it innermost: the parse it wraps is the one the outer wrappers keep."""

    def wrap(self, handler: grpc.RpcMethodHandler,
             call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = call.method

        @contextlib.asynccontextmanager
        async def mapped(context: aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
            try:
                yield
            except aio.AbortError:
                raise
            except Exception as exc:
                await _abort_for(exc, context, method)

        wrapped = wrap_handler(handler, mapped)
        for kind in ("unary_unary", "unary_stream"):
            fn = getattr(wrapped, kind)
            if fn is not None:
                return FACTORIES[kind](
                    _refusing_undecodable(fn, method),
                    request_deserializer=tolerant(wrapped.request_deserializer),
                    response_serializer=wrapped.response_serializer,
                )
        return wrapped
