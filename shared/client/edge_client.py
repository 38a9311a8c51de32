"""A Python client for the edge agent, for applications.

    async with EdgeClient("127.0.0.1:50062") as client:
        async for event in client.ask(AskSpec("What is moving?")):
            ...
        answer = await client.ask_final(AskSpec("What is moving?"))

Over a network: ``EdgeClient(address, security=ClientSecurity(tls=True, ca=Path("ca.pem"),
token="..."))`` verifies the edge's certificate and sends the token on every call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType

import grpc
from grpc import aio

from eventspec.shared.contract import convert_ask
from eventspec.shared.contract.types import AskEvent, AskSpec, FinalEvent
from eventspec.shared.pb.eventspec.v1 import edge_pb2, edge_pb2_grpc
from eventspec.shared.wire.channel import call_metadata, open_channel
from eventspec.shared.wire.options import channel_options
from eventspec.shared.wire.security import ClientSecurity
from eventspec.shared.wire.transport_hint import with_hint


class AskError(Exception):
    """The edge answered with an error status; ``code`` and ``details`` say which."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


def _translated(address: str, exc: aio.AioRpcError, *, tls: bool = False) -> AskError:
    """The call's status as an AskError whose text says what to do about it.

    gRPC's own text for two common mistakes names no cause: "Method not found!" when the
    address serves another service (usually the cloud verifier's port), and a socket
    error when nothing listens there.
    """
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNIMPLEMENTED:
        details = (f"{address} does not serve the eventspec.v1.EdgeAgent service (is it "
                   f"the cloud verifier's port? point the client at the edge agent) "
                   f"[{details}]")
    elif code == grpc.StatusCode.UNAVAILABLE and details.startswith("cloud verifier:"):
        # The edge answered: it is its cloud that is down (the edge's status says which).
        details = f"the edge agent at {address} cannot use its cloud verifier: {details}"
    elif code == grpc.StatusCode.UNAVAILABLE and details.startswith("edge agent:"):
        details = f"the edge agent at {address} is up but not ready: {details}"
    elif code == grpc.StatusCode.UNAVAILABLE:
        # "Socket closed" for a plaintext client at a TLS port says nothing of --tls.
        details = with_hint(f"cannot reach the edge agent at {address}: {details}", details,
                            tls=tls)
    return AskError(code, details)


class EdgeClient:
    """Talks to one edge agent over a reused channel."""

    def __init__(self, address: str, *, timeout_s: float = 300.0,
                 security: ClientSecurity | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = call_metadata(security)
        self._tls = security is not None and security.tls
        self._channel = open_channel(address, security, channel_options())
        self._stub = edge_pb2_grpc.EdgeAgentStub(self._channel)

    async def __aenter__(self) -> EdgeClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def ask(self, spec: AskSpec) -> AsyncIterator[AskEvent]:
        """Stream previews, committed text and the final answer."""
        call = self._stub.Ask(convert_ask.ask_spec_to_pb(spec), timeout=self.timeout_s,
                              metadata=self._metadata)
        try:
            async for msg in call:
                yield convert_ask.ask_event_from_pb(msg)
        except aio.AioRpcError as exc:
            raise _translated(self.address, exc, tls=self._tls) from None

    async def ask_final(self, spec: AskSpec) -> FinalEvent:
        """Just the final answer and statistics."""
        final: FinalEvent | None = None
        async for event in self.ask(spec):
            if isinstance(event, FinalEvent):
                final = event
        if final is None:
            raise AskError(grpc.StatusCode.INTERNAL, "the edge ended the stream without a Final")
        return final

    async def status(self) -> edge_pb2.EdgeStatus:
        try:
            status: edge_pb2.EdgeStatus = await self._stub.GetStatus(
                edge_pb2.GetStatusRequest(), timeout=10, metadata=self._metadata
            )
            return status
        except aio.AioRpcError as exc:
            raise _translated(self.address, exc, tls=self._tls) from None

    async def close(self) -> None:
        await self._channel.close()
