"""Client-side health polling: wait until a server reports SERVING on grpc.health.v1,
and say why it does not yet (``eventspec wait``, the demo and the tests use it)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eventspec.shared.pb.eventspec.v1 import (
    edge_pb2,
    edge_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)
from eventspec.shared.wire.channel import Metadata, call_metadata, open_channel
from eventspec.shared.wire.interceptors import WARMING_UP_KEY
from eventspec.shared.wire.security import ClientSecurity
from eventspec.shared.wire.transport_hint import transport_fault


async def not_serving_reason(channel: aio.Channel, metadata: Metadata = ()) -> str:
    """What a NOT_SERVING eventspec node says it is doing: a warming cloud's phase (from
    GetServerInfo's trailing metadata) or an edge's ``not_serving_reason`` (GetStatus).
    Empty when the server says nothing (not ours, or it needs a token we lack)."""
    try:
        await verifier_pb2_grpc.VerifierStub(channel).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=2, metadata=metadata)
    except aio.AioRpcError as exc:
        for key, value in exc.trailing_metadata() or ():
            if key == WARMING_UP_KEY:
                return f"cloud verifier warming up: {value}"
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            return ""
    else:
        return ""
    try:
        status = await edge_pb2_grpc.EdgeAgentStub(channel).GetStatus(
            edge_pb2.GetStatusRequest(), timeout=2, metadata=metadata)
    except aio.AioRpcError:
        return ""
    return str(status.not_serving_reason)


class NeverServing(Exception):
    """The node will not report SERVING however long one waits: nothing listened within
    the connect budget, the port speaks another protocol or TLS setting, the server is
    not an eventspec node, it refused this client's token, or it is an edge whose
    ``--cloud`` is not a Verifier (or refuses it). The message says which and the fix."""


#: An edge's ``link.cloud_state`` values that its operator must fix (edge/readiness.py).
_PERMANENT_CLOUD_STATES = ("not an eventspec Verifier", "refused this edge")


async def _identity_fault(channel: aio.Channel, security: ClientSecurity | None,
                          address: str) -> str:
    """Why a server that answers health is not the eventspec node one waits for, or "":
    neither service is there, or it refused the token given."""
    metadata = call_metadata(security)
    codes = []
    try:
        await verifier_pb2_grpc.VerifierStub(channel).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=2, metadata=metadata)
        return ""
    except aio.AioRpcError as exc:
        codes.append(exc.code())
    try:
        await edge_pb2_grpc.EdgeAgentStub(channel).GetStatus(
            edge_pb2.GetStatusRequest(), timeout=2, metadata=metadata)
        return ""
    except aio.AioRpcError as exc:
        codes.append(exc.code())
    if all(c == grpc.StatusCode.UNIMPLEMENTED for c in codes):
        return (f"{address} answers gRPC health but serves neither an eventspec Verifier "
                "nor an EdgeAgent: check the port")
    if security is not None and security.token and any(
            c in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
            for c in codes):
        return f"{address} refused this client's token ({codes[-1].name}): check --token-file"
    return ""


async def wait_for_serving(address: str, timeout_s: float = 60.0, service: str = "",
                           security: ClientSecurity | None = None,
                           on_reason: Callable[[str], None] | None = None, *,
                           connect_budget_s: float | None = None,
                           check_identity: bool = False,
                           on_tick: Callable[[float, str], None] | None = None) -> None:
    """Poll grpc.health.v1 at ``address`` until SERVING.

    Health needs no token, but a TLS port needs ``security`` (and a mutual-TLS port a
    client certificate) for the handshake. ``on_reason`` hears each new reason the
    server gives for not serving yet (or "unreachable: ..." while nothing answers);
    ``on_tick`` hears (seconds waited, last reason) at every poll, for a live counter.

    Raises TimeoutError after ``timeout_s``, and NeverServing at once for a fault that
    waiting cannot cure (a TLS or protocol mismatch, no health service; with
    ``check_identity``, a server that is not an eventspec node, a refused token, an edge
    whose cloud is wrong), or when nothing has answered for ``connect_budget_s`` (None:
    keep trying until the timeout, for a node that is not started yet).
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + timeout_s
    last = ""
    contacted = False
    tls = security is not None and security.tls
    async with open_channel(address, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            reason = ""
            try:
                resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
                if check_identity and not contacted:
                    fault = await _identity_fault(channel, security, address)
                    if fault:
                        raise NeverServing(fault)
                contacted = True
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
                if on_reason is not None or on_tick is not None or check_identity:
                    reason = (await not_serving_reason(channel, call_metadata(security))
                              or "NOT_SERVING")
                if check_identity and any(s in reason for s in _PERMANENT_CLOUD_STATES):
                    raise NeverServing(f"{address}: {reason}: the edge's --cloud (or the "
                                       "cloud's credentials for it) must be fixed; waiting "
                                       "will not help")
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, aio.AioRpcError) else None
                details = exc.details() if isinstance(exc, aio.AioRpcError) else ""
                if code == grpc.StatusCode.UNIMPLEMENTED:
                    raise NeverServing(f"{address} answers gRPC but has no health service: "
                                       "not an eventspec node; check the port") from exc
                transport = transport_fault(details or "", tls=tls)
                if transport is not None and transport.permanent:
                    raise NeverServing(f"{address}: {transport.hint}") from exc
                waited = loop.time() - start
                if (transport is not None and not contacted and connect_budget_s is not None
                        and waited >= connect_budget_s):
                    raise NeverServing(
                        f"{address}: nothing answered for {waited:.0f} s: {transport.hint}; "
                        "pass --retry-refused to wait for a node that is not started yet"
                    ) from exc
                reason = f"unreachable ({code.name if code else 'no answer'})"
                if transport is not None:
                    reason = f"unreachable: {transport.hint}"
            if on_reason is not None and reason and reason != last:
                on_reason(reason)
            last = reason or last
            if on_tick is not None:
                on_tick(loop.time() - start, last)
            if loop.time() > deadline:
                why = f" (last: {last})" if last else ""
                raise TimeoutError(
                    f"{address} did not report SERVING within {timeout_s:.0f} s{why}")
            await asyncio.sleep(0.1 if on_reason is None and on_tick is None else 0.25)
