"""The Verifier gRPC servicer: thin. Parses, delegates to ``cloud.generation``, converts.

Errors are raised as ``shared.errors`` exceptions and mapped to statuses by
``shared.wire.interceptors.ErrorMappingInterceptor``. A request that ends with Done is
logged by ``cloud.generation``; one that ends otherwise (refused, failed, or cancelled by
the edge going away) is logged here, so every request leaves exactly one line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from cloud.generation import ByteCounter, run_generate
from cloud.runtime import VerifierRuntime
from shared import convert
from shared.convert import EdgeInbound
from shared.errors import EventSpecError, Unavailable
from shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from shared.types import DoneEvent, OpenRequest

log = logging.getLogger(__name__)


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    """``eventspec.v1.Verifier`` over a ``VerifierRuntime``."""

    def __init__(self, runtime: VerifierRuntime | None = None) -> None:
        self._rt = runtime

    def attach(self, runtime: VerifierRuntime) -> None:
        """Start serving requests once warm-up has built the runtime."""
        self._rt = runtime

    @property
    def rt(self) -> VerifierRuntime:
        if self._rt is None:
            raise Unavailable("the verifier is still warming up; retry when health is SERVING")
        return self._rt

    async def GetServerInfo(
        self, request: verifier_pb2.GetServerInfoRequest, context: Any
    ) -> verifier_pb2.ServerInfo:
        return convert.server_info_to_pb(self.rt.current_info())

    async def Generate(
        self, request_iterator: AsyncIterator[verifier_pb2.EdgeMessage], context: Any
    ) -> AsyncIterator[verifier_pb2.CloudMessage]:
        rt = self.rt
        counter = ByteCounter()
        started = time.perf_counter()
        request_id = "(before Open)"
        outcome: str | None = "CANCELLED"  # the edge went away mid-stream

        async def inbound() -> AsyncIterator[EdgeInbound]:
            nonlocal request_id
            async for msg in request_iterator:
                counter.uplink += msg.ByteSize()
                parsed = convert.edge_message_from_pb(msg)
                if isinstance(parsed, OpenRequest):
                    request_id = parsed.request_id
                yield parsed

        try:
            async for event in run_generate(rt, inbound(), counter):
                if isinstance(event, DoneEvent):
                    outcome = None  # cloud.generation logged it
                out = convert.cloud_message_to_pb(event)
                counter.downlink += out.ByteSize()
                yield out
        except EventSpecError as exc:
            outcome = f"{exc.code.name}: {exc.message}"
            raise
        except Exception as exc:
            outcome = f"INTERNAL ({type(exc).__name__})"
            raise
        finally:
            if outcome is not None:
                log.info("request %s: %s after %.1f ms", request_id, outcome,
                         (time.perf_counter() - started) * 1e3)
