"""The Verifier gRPC servicer: thin. Parses, delegates to ``eventspec.cloud.requests.generation``,
converts.

Errors are raised as ``eventspec.shared.contract.errors`` exceptions and mapped to statuses by
``eventspec.shared.wire.interceptors.ErrorMappingInterceptor``. Every request, however it ends,
leaves one log line (``eventspec.cloud.requests.log``, written by
``eventspec.cloud.requests.generation``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from eventspec.cloud.live_stats import live_stats
from eventspec.cloud.requests.generation import ByteCounter, run_generate
from eventspec.cloud.runtime import VerifierRuntime
from eventspec.shared.contract import convert_verifier
from eventspec.shared.contract.convert_verifier import EdgeInbound
from eventspec.shared.contract.errors import WarmingUp
from eventspec.shared.node.tracing import set_incoming
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    """``eventspec.v1.Verifier`` over a ``VerifierRuntime``."""

    def __init__(self, runtime: VerifierRuntime | None = None) -> None:
        self._rt = runtime
        #: What warm-up is doing now; callers see it until the runtime is attached.
        self.phase = "starting"
        self._started = time.monotonic()

    def attach(self, runtime: VerifierRuntime) -> None:
        """Start serving requests once warm-up has built the runtime."""
        self._rt = runtime

    @property
    def rt(self) -> VerifierRuntime:
        if self._rt is None:
            raise WarmingUp(self.phase)
        return self._rt

    async def GetServerInfo(
        self, request: verifier_pb2.GetServerInfoRequest, context: Any
    ) -> verifier_pb2.ServerInfo:
        return convert_verifier.server_info_to_pb(self.rt.current_info())

    async def GetStats(
        self, request: verifier_pb2.GetStatsRequest, context: Any
    ) -> verifier_pb2.VerifierStats:
        """The live view; answers while warming up too (with the phase)."""
        return convert_verifier.verifier_stats_to_pb(
            live_stats(self._rt, phase=self.phase, uptime_s=time.monotonic() - self._started))

    async def Generate(
        self, request_iterator: AsyncIterator[verifier_pb2.EdgeMessage], context: Any
    ) -> AsyncIterator[verifier_pb2.CloudMessage]:
        rt = self.rt
        counter = ByteCounter()
        if rt.tracer is not None:  # the edge's trace context, for run_generate's span
            set_incoming(context.invocation_metadata())

        async def inbound() -> AsyncIterator[EdgeInbound]:
            async for msg in request_iterator:
                counter.uplink += msg.ByteSize()
                yield convert_verifier.edge_message_from_pb(msg)

        async for event in run_generate(rt, inbound(), counter):
            out = convert_verifier.cloud_message_to_pb(event)
            counter.downlink += out.ByteSize()
            yield out
