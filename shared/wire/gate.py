"""Every call sends its first complete message within a bound, before it costs anything.

gRPC's own ``maximum_concurrent_rpcs`` counts a call from its HEADERS, and for a method
with a single request message the handler (and with it authentication and the
node's concurrency limit) runs only once the whole message has arrived. So a client
that opens streams, sends HEADERS and part of a message and then waits, held every
slot without a token: health checks, GetServerInfo and authenticated Asks were refused
while it kept its connections alive (issue 19).

This interceptor serves every method as request-streaming (on the wire a single
request message is the same HTTP/2 stream), so the handler starts at HEADERS. It
then waits at most ``timeout_s`` for the first complete message, ending the call with
DEADLINE_EXCEEDED otherwise, and only then enters the inner interceptors: the
concurrency limit therefore counts calls whose message has arrived, and an
unauthenticated stream (the auth interceptor, installed outside this one, refuses it
at HEADERS) costs nothing. The number of streams per connection is capped by HTTP/2's
``MAX_CONCURRENT_STREAMS`` (``eventspec.shared.wire.options``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from eventspec.shared.contract.errors import EventSpecError
from eventspec.shared.wire.handlers import FACTORIES, Behaviour
from eventspec.shared.wire.interceptors import bounded_details
from eventspec.shared.wire.status import to_grpc

log = logging.getLogger(__name__)

#: Seconds from a call's HEADERS to its first complete request message.
FIRST_MESSAGE_TIMEOUT_S = 10.0

_STREAMING_KIND = {
    "unary_unary": "stream_unary",
    "unary_stream": "stream_stream",
    "stream_unary": "stream_unary",
    "stream_stream": "stream_stream",
}


class _Ended(Exception):
    """The stream closed before its first message."""


async def _first(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any],
                 method: str, timeout_s: float) -> Any:
    """The first request message, or the call ended with a status naming the bound."""
    try:
        return await asyncio.wait_for(anext(requests), timeout=timeout_s)
    except TimeoutError:
        log.warning("DEADLINE_EXCEEDED %s from %s: no complete request message within "
                    "%g s (the first-message timeout)", method, context.peer(), timeout_s)
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"no complete request message within {timeout_s:g} s of the "
                            "call's start (the first-message timeout)")
    except StopAsyncIteration:
        raise _Ended from None
    except DecodeError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"{method.rsplit('/', 1)[-1]}: malformed request message: {exc}")
    except EventSpecError as exc:  # a check on the bytes refused them before parsing
        await context.abort(to_grpc(exc.code), bounded_details(exc.message))
    raise AssertionError("unreachable: abort raises")


async def _then(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


def _gated(kind: str, fn: Behaviour, method: str, timeout_s: float) -> Behaviour:
    """``fn`` (of ``kind``) as a request-streaming behaviour that starts at HEADERS and
    calls ``fn`` once the first message is in."""
    single = kind.startswith("unary_")

    async def arrived(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]
                      ) -> Any:
        try:
            first = await _first(requests, context, method, timeout_s)
        except _Ended:
            if single:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{method.rsplit('/', 1)[-1]}: the call ended before "
                                    "its request message")
            return _then_nothing()
        return first if single else _then(first, requests)

    if inspect.isasyncgenfunction(fn):

        async def gen(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]
                      ) -> AsyncIterator[Any]:
            async for item in fn(await arrived(requests, context), context):
                yield item

        return gen

    async def coro(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]
                   ) -> Any:
        return await fn(await arrived(requests, context), context)

    return coro


async def _then_nothing() -> AsyncIterator[Any]:
    return
    yield  # an empty async generator: the stream closed with no message


class FirstMessageGate(aio.ServerInterceptor):  # type: ignore[misc]
    """Start every call at HEADERS and give it ``timeout_s`` to send its first message;
    the inner interceptors and the handler run only after it has."""

    def __init__(self, timeout_s: float = FIRST_MESSAGE_TIMEOUT_S) -> None:
        if not timeout_s > 0:
            raise ValueError(f"the first-message timeout must be > 0 s, got {timeout_s}")
        self.timeout_s = timeout_s

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        for kind, streaming in _STREAMING_KIND.items():
            fn = getattr(handler, kind)
            if fn is not None:
                return FACTORIES[streaming](
                    _gated(kind, fn, method, self.timeout_s),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler
