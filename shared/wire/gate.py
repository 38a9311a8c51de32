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

The methods that need no credentials (health) are read whole from anyone, up to the
node's message cap (8 MiB on the cloud): 256 streams of one connection could have held
2 GiB before any credential was asked for (issue 38, red-team finding 1). So a
connection may have at most ``OPEN_READS_PER_CONNECTION`` calls of ``open_methods``
waiting for their first message; a call beyond that is refused with RESOURCE_EXHAUSTED
at HEADERS, before its message is read. A legitimate client has one or two (gRPC's
client-side health Watch, a Check); one connection's excess refuses only its own calls.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

from eventspec.shared.contract.errors import EventSpecError
from eventspec.shared.wire.handlers import (
    FACTORIES,
    Behaviour,
    MethodInterceptor,
    close_request_stream,
    forget_frames,
)
from eventspec.shared.wire.interceptors import bounded_details
from eventspec.shared.wire.refusals import mark_refused
from eventspec.shared.wire.status import to_grpc

log = logging.getLogger(__name__)

#: Seconds from a call's HEADERS to its first complete request message.
FIRST_MESSAGE_TIMEOUT_S = 10.0
#: Calls of the methods open to anyone (health) that one connection may have waiting
#: for their first message: what it can make the node read before any credential.
OPEN_READS_PER_CONNECTION = 4

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
        mark_refused()
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"{method.rsplit('/', 1)[-1]}: malformed request message: {exc}")
    except EventSpecError as exc:  # a check on the bytes refused them before parsing
        mark_refused()
        await context.abort(to_grpc(exc.code), bounded_details(exc.message))
    raise AssertionError("unreachable: abort raises")


class ConnectionReads:
    """Calls waiting for their first message, per connection (the peer's address and
    port), at most ``limit`` each."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the reads per connection must be >= 1, got {limit}")
        self.limit = limit
        self.waiting: dict[str, int] = {}

    def take(self, peer: str) -> bool:
        n = self.waiting.get(peer, 0)
        if n >= self.limit:
            return False
        self.waiting[peer] = n + 1
        return True

    def give(self, peer: str) -> None:
        n = self.waiting.pop(peer, 0) - 1
        if n > 0:
            self.waiting[peer] = n


async def _first_in_slot(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any],
                         method: str, timeout_s: float, reads: ConnectionReads | None) -> Any:
    """``_first``, holding one of the connection's ``reads`` while it waits (RESOURCE_EXHAUSTED
    at once when they are all taken)."""
    if reads is None:
        return await _first(requests, context, method, timeout_s)
    peer = context.peer()
    if not reads.take(peer):
        log.warning("RESOURCE_EXHAUSTED %s from %s: %d calls of this connection already "
                    "wait for their request", method, peer, reads.limit)
        mark_refused()
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"{method.rsplit('/', 1)[-1]}: this connection already has "
                            f"{reads.limit} calls waiting for their request message; retry "
                            "once they are answered")
    try:
        return await _first(requests, context, method, timeout_s)
    finally:
        reads.give(peer)


async def _then(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


def _gated(kind: str, fn: Behaviour, method: str, timeout_s: float,
           reads: ConnectionReads | None = None) -> Behaviour:
    """``fn`` (of ``kind``) as a request-streaming behaviour that starts at HEADERS and
    calls ``fn`` once the first message is in (read within one of ``reads``, if given)."""
    single = kind.startswith("unary_")

    async def arrived(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]
                      ) -> Any:
        try:
            first = await _first_in_slot(requests, context, method, timeout_s, reads)
        except _Ended:
            if single:
                mark_refused()
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{method.rsplit('/', 1)[-1]}: the call ended before "
                                    "its request message")
            return _then_nothing()
        return first if single else _then(first, requests)

    if inspect.isasyncgenfunction(fn):

        async def gen(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]
                      ) -> AsyncIterator[Any]:
            try:
                async for item in fn(await arrived(requests, context), context):
                    yield item
            except aio.AbortError as exc:
                forget_frames(exc)
                raise
            finally:
                await close_request_stream(requests)

        return gen

    async def coro(requests: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]
                   ) -> Any:
        try:
            return await fn(await arrived(requests, context), context)
        except aio.AbortError as exc:
            forget_frames(exc)
            raise
        finally:
            await close_request_stream(requests)

    return coro


async def _then_nothing() -> AsyncIterator[Any]:
    return
    yield  # an empty async generator: the stream closed with no message


class FirstMessageGate(MethodInterceptor):
    """Start every call at HEADERS and give it ``timeout_s`` to send its first message;
    the inner interceptors and the handler run only after it has. Calls of
    ``open_methods`` wait for it ``reads_per_connection`` at a time per connection."""

    def __init__(self, timeout_s: float = FIRST_MESSAGE_TIMEOUT_S, *,
                 open_methods: frozenset[str] = frozenset(),
                 reads_per_connection: int = OPEN_READS_PER_CONNECTION) -> None:
        if not timeout_s > 0:
            raise ValueError(f"the first-message timeout must be > 0 s, got {timeout_s}")
        self.timeout_s = timeout_s
        self.open_methods = open_methods
        self.open_reads = ConnectionReads(reads_per_connection)

    def wrap(self, handler: grpc.RpcMethodHandler,
             call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = call.method
        for kind, streaming in _STREAMING_KIND.items():
            fn = getattr(handler, kind)
            if fn is not None:
                reads = self.open_reads if method in self.open_methods else None
                return FACTORIES[streaming](
                    _gated(kind, fn, method, self.timeout_s, reads),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler
