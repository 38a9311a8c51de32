"""One Generate call to the cloud verifier: domain messages out, the cloud's replies in.

:class:`CloudStream` is the gRPC implementation of ``eventspec.edge.uplink.roles.VerifierStream``
that ``CloudLink.open_stream`` hands out: it converts each message to and from the
wire, counts the bytes each way, and turns a failed call into the error it ended with
(``eventspec.edge.uplink.errors``). A replica that dropped the stream rests a moment so
the request's retry goes elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio

from eventspec.edge.uplink.errors import rpc_error, status_error
from eventspec.edge.uplink.replicas import Replica
from eventspec.shared.contract import convert_verifier
from eventspec.shared.contract.convert_verifier import CloudOutbound, EdgeInbound
from eventspec.shared.contract.errors import EventSpecError, Unavailable

log = logging.getLogger(__name__)

#: How long a replica that dropped a stream (UNAVAILABLE) sits out.
DROPPED_REST_S = 5.0
#: How long a failed write waits for its call's final status.
FINAL_STATUS_WAIT_S = 2.0


class CloudStream:
    """One Generate call: ``send`` domain messages, iterate the cloud's replies."""

    def __init__(self, call: Any, address: str, replica: Replica | None = None) -> None:
        self._call = call
        self._address = address
        self.replica = replica
        self.uplink_bytes = 0
        self.downlink_bytes = 0

    async def send(self, msg: EdgeInbound, *, best_effort: bool = False) -> None:
        """Write one message. ``best_effort`` writes (drafts) that find the call already
        finished are dropped: the reply stream reports how the call ended."""
        pb = convert_verifier.edge_message_to_pb(msg)
        try:
            await self._call.write(pb)
        except (grpc.RpcError, aio.UsageError, asyncio.InvalidStateError) as exc:
            if best_effort:
                return
            # A write fails because the call has ended; how it ended (RESOURCE_EXHAUSTED
            # from a full cloud, INVALID_ARGUMENT, ...) is its final status, not the
            # write's own error (INTERNAL "sending to Generate failed" said nothing).
            final = await self._final_status()
            if final is not None:
                raise self._failed(final) from exc
            if isinstance(exc, grpc.RpcError):
                raise self._failed(rpc_error(exc, self._address, "sending to Generate")) from exc
            log.warning("cloud verifier at %s: Generate stream closed", self._address)
            raise Unavailable("cloud verifier: the stream closed") from exc
        self.uplink_bytes += pb.ByteSize()

    async def _final_status(self) -> EventSpecError | None:
        """The error the call ended with, once it has ended (None: OK or unknown)."""
        try:
            code = await asyncio.wait_for(self._call.code(), FINAL_STATUS_WAIT_S)
            details = await self._call.details()
        except (TimeoutError, grpc.RpcError):
            return None
        if code in (None, grpc.StatusCode.OK):
            return None
        return status_error(code, details or "", self._address, "Generate")

    async def done_writing(self) -> None:
        with contextlib.suppress(grpc.RpcError, aio.UsageError):
            await self._call.done_writing()

    async def replies(self) -> AsyncIterator[CloudOutbound]:
        try:
            while True:
                msg = await self._call.read()
                if msg is aio.EOF:
                    return
                self.downlink_bytes += msg.ByteSize()
                yield convert_verifier.cloud_message_from_pb(msg)
        except grpc.RpcError as exc:
            raise self._failed(rpc_error(exc, self._address, "Generate")) from exc

    def _failed(self, err: EventSpecError) -> EventSpecError:
        """A replica that dropped the stream (UNAVAILABLE) sits out a moment, so the
        request's retry goes to another one rather than back to it."""
        if isinstance(err, Unavailable) and self.replica is not None:
            self.replica.rest(DROPPED_REST_S)
        return err

    def cancel(self) -> None:
        self._call.cancel()

