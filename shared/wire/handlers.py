"""Wrap a gRPC method handler's behaviour in an async context, whatever its kind.

A response-streaming behaviour in ``grpc.aio`` is either an async generator (yields
responses) or a coroutine that calls ``context.write`` (``Health/Watch`` is one). A
wrapper that assumes the first breaks the second ("'async for' requires an object
with __aiter__ method, got coroutine"), so each kind is wrapped as what it is.

``forget_frames``: an exception's traceback holds the frames it passed through, and
their locals (a request's bytes, the parsed message). ``grpc.aio`` keeps the exception a
call was aborted with (``RPCState.abort_exception``) for as long as the call's state
lives, and that state is in a reference cycle with the exception's frames, so only a
full garbage collection frees it: rare in a node whose heap holds the model (issue 38,
red-team finding 1).

``MethodInterceptor``: what every server interceptor here does first, once: await the
handler the service has for the call's method, pass on a method no service has
(``None``) as it is, and rewrite the handler of one it has.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import grpc
from grpc import aio

#: Entered around one call with that call's context; it may abort or translate errors.
Around = Callable[[aio.ServicerContext[Any, Any]], AbstractAsyncContextManager[None]]
E = TypeVar("E", bound=BaseException)
Behaviour = Callable[[Any, aio.ServicerContext[Any, Any]], Any]


def wrap_behaviour(fn: Behaviour, around: Around) -> Behaviour:
    """``fn`` run inside ``around(context)``, keeping its kind (generator or coroutine).

    Whatever ends the call, even ``around`` refusing it before ``fn`` ran, the request
    stream is closed and an abort's frames dropped (:func:`close_request_stream`,
    :func:`forget_frames`): a call refused at HEADERS otherwise left its stream unread,
    which is how ``grpc.aio`` kept refused calls' state alive (issue 38). (It did not
    change what a node keeps after a flood the refusal budget holds: +107 to +137 MB,
    ``benchmarks/results/refused-memory-cpu.json``.)"""
    if inspect.isasyncgenfunction(fn):

        async def gen_wrapper(request: Any, context: aio.ServicerContext[Any, Any]
                              ) -> AsyncIterator[Any]:
            try:
                async with around(context):
                    async for item in fn(request, context):
                        yield item
            except aio.AbortError as exc:
                forget_frames(exc)
                raise
            finally:
                await close_request_stream(request)

        return gen_wrapper

    async def coro_wrapper(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        try:
            async with around(context):
                return await fn(request, context)
        except aio.AbortError as exc:
            forget_frames(exc)
            raise
        finally:
            await close_request_stream(request)

    return coro_wrapper


async def close_request_stream(request: Any) -> None:
    """Close a request-streaming call's request stream (a no-op for a single message,
    or for a stream already closed).

    ``grpc.aio`` hands a request-streaming handler a receiver whose async generator,
    left suspended (a call that ends before reading its stream's end: every refusal),
    kept the call's whole state alive for good, with the frames of the exception it was
    aborted with (issue 38, red-team finding 1). A generator another task is still
    reading (``RuntimeError``) is left to that task."""
    aiter_ = getattr(request, "__aiter__", None)
    if aiter_ is None:
        return
    close = getattr(aiter_(), "aclose", None)
    if close is not None:
        with contextlib.suppress(RuntimeError):
            await close()


def forget_frames(exc: E) -> E:
    """``exc`` without its traceback and without the exceptions it was raised while
    handling (``__context__``, ``__cause__``) and theirs: whoever keeps it then keeps no
    frame, so no request. Returns ``exc``."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        todo += [e.__context__, e.__cause__]
        e.__traceback__ = None
    exc.__context__ = exc.__cause__ = None
    return exc


FACTORIES = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def wrap_handler(handler: grpc.RpcMethodHandler, around: Around) -> grpc.RpcMethodHandler:
    """The same handler with its behaviour wrapped by ``around``."""
    for kind, factory in FACTORIES.items():
        fn = getattr(handler, kind)
        if fn is not None:
            return factory(
                wrap_behaviour(fn, around),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


class MethodInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """A server interceptor that rewrites the handler of each method a service has.

    ``intercept_service`` awaits the handler and passes ``None`` (no such method) on
    unchanged; ``wrap`` returns the handler to run instead (or the same one)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return self.wrap(handler, handler_call_details)

    def wrap(self, handler: grpc.RpcMethodHandler,
             call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """The handler to run for ``call`` (its method, its metadata) instead of ``handler``."""
        raise NotImplementedError
