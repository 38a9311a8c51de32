"""Checks on a request's bytes that run before protobuf parses them.

An interceptor cannot see a message's bytes, but it can replace the method handler's
deserializer, which gets them whole: this one puts a check in front of the parse for
the methods in ``REQUEST_GUARDS``. A check raises an ``EventSpecError`` to refuse; for a
single-message method ``ErrorMappingInterceptor`` (outside this one) turns that into the
call's status, for a stream the ``FirstMessageGate`` (first message) or the handler's own
mapping (later ones) does. Why before the parse: refusing 10^6 stop strings after
parsing them cost the event loop ~100 ms a request (issue 38, red-team finding 2); the
checks in ``eventspec.shared.contract.wire_bounds`` cost microseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import grpc

from eventspec.shared.contract.wire_bounds import check_ask_bytes, check_edge_message_bytes
from eventspec.shared.pb.eventspec.v1 import edge_pb2, verifier_pb2
from eventspec.shared.wire.handlers import FACTORIES, MethodInterceptor

#: A check on one request message's bytes; raises an ``EventSpecError`` to refuse it.
Guard = Callable[[bytes], None]
Deserializer = Callable[[bytes], Any]


def _path(service: Any, method: str) -> str:
    return f"/{service.full_name}/{service.methods_by_name[method].name}"


#: The requests whose bytes are checked: the two that carry generation settings.
REQUEST_GUARDS: Mapping[str, Guard] = {
    _path(edge_pb2.DESCRIPTOR.services_by_name["EdgeAgent"], "Ask"): check_ask_bytes,
    _path(verifier_pb2.DESCRIPTOR.services_by_name["Verifier"], "Generate"):
        check_edge_message_bytes,
}


def guarded(guard: Guard, deserialize: Deserializer) -> Deserializer:
    """``deserialize`` that runs ``guard`` on the bytes first."""

    def parse(data: bytes) -> Any:
        guard(data)
        return deserialize(data)

    return parse


class RequestGuardInterceptor(MethodInterceptor):
    """Run ``guards[method]`` on each request message's bytes before it is parsed.

    Install it innermost, after ``ErrorMappingInterceptor``: the deserializer each outer
    interceptor keeps is the one this returns."""

    def __init__(self, guards: Mapping[str, Guard] = REQUEST_GUARDS) -> None:
        self.guards = dict(guards)

    def wrap(self, handler: grpc.RpcMethodHandler,
             call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        guard = self.guards.get(call.method)
        if guard is None or handler.request_deserializer is None:
            return handler
        parse = guarded(guard, handler.request_deserializer)
        for kind, factory in FACTORIES.items():
            fn = getattr(handler, kind)
            if fn is not None:
                return factory(fn, request_deserializer=parse,
                               response_serializer=handler.response_serializer)
        return handler
