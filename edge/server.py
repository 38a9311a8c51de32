"""The edge process: source, draft model, cloud link, and the EdgeAgent gRPC server.

Like the cloud: bind and report NOT_SERVING, load the draft model and measure its
costs, then SERVING; on shutdown NOT_SERVING and ``stop(grace)``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from edge.agent import EdgeAgent
from edge.align import FeatureAdapter, load_adapter
from edge.cloud_link import CloudLink
from edge.config import EdgeSettings
from edge.draft import DraftModel
from edge.draft_checkpoint import load_draft
from edge.events.base import EventSource
from edge.events.sources import open_source
from edge.model_dirs import TOY, adapter_dir, draft_dir
from edge.servicer import EdgeAgentServicer
from shared.errors import EventSpecError
from shared.pb.eventspec.v1 import edge_pb2, edge_pb2_grpc
from shared.serving import MODEL_DTYPES
from shared.wire.host import GrpcHost
from shared.wire.security import check_server_start

log = logging.getLogger(__name__)

SERVICE_NAME = edge_pb2.DESCRIPTOR.services_by_name["EdgeAgent"].full_name


def load_draft_for(settings: EdgeSettings) -> DraftModel:
    """The draft in the directory ``--model`` names (``toy``: the shipped toy draft)."""
    import torch

    dtype = getattr(torch, MODEL_DTYPES[settings.dtype])
    return load_draft(draft_dir(settings.model), device=settings.device, dtype=dtype)


def warn_on_vocab_mismatch(cloud: str, cloud_fingerprint: str, draft_fingerprint: str) -> bool:
    """Log a loud WARNING when the cloud's text vocabulary is not the draft's.

    Such a cloud still answers target_only requests, so it is "reachable"; but every
    speculative request to it is refused (drafts in another vocabulary would be
    meaningless), which an operator must learn at start-up, not from clients. Returns
    whether they differ.
    """
    if cloud_fingerprint == draft_fingerprint:
        return False
    log.warning(
        "VOCABULARY MISMATCH: the cloud %s's text vocabulary (fingerprint %s) differs from "
        "the draft model's (%s); speculative requests will be refused, only target_only "
        "(and draft_only) work. Pair the draft with a target of the same tokenizer.",
        cloud, cloud_fingerprint[:12], draft_fingerprint[:12],
    )
    return True


@dataclass
class EdgeServer:
    """A running edge agent: ``await start()``, then ``port``; ``await stop()``."""

    settings: EdgeSettings
    source: EventSource | None = None
    draft: DraftModel | None = None
    adapter: FeatureAdapter | None = None
    port: int = 0
    agent: EdgeAgent | None = None
    _host: GrpcHost | None = None
    _link: CloudLink | None = None
    _owned_source: EventSource | None = None

    async def start(self) -> int:
        s = self.settings
        host = GrpcHost(SERVICE_NAME, max_message_bytes=s.max_message_bytes, max_rpcs=64,
                        security=s.security,
                        unlimited_methods=frozenset({f"/{SERVICE_NAME}/GetStatus"}))
        check_server_start(s.host, s.port, s.security)  # refuse before loading models
        await host.set_serving(False)
        source = self.source
        if source is None:
            source = await asyncio.to_thread(
                open_source, s.source, allow_pickle=s.allow_pickle, sensor_size=s.sensor_size
            )
            self._owned_source = source  # opened here, so closed here (live readers, files)
        draft = self.draft
        if draft is None:
            draft = await asyncio.to_thread(load_draft_for, s)
        adapter = self.adapter
        # The toy draft brings its adapter unless told otherwise.
        adapter_name = s.adapter
        if adapter_name is None and s.model == TOY and self.draft is None:
            adapter_name = Path(TOY)
        if adapter is None and adapter_name is not None:
            adapter = await asyncio.to_thread(load_adapter, adapter_dir(adapter_name))
        self._link = (
            CloudLink(s.cloud, max_message_bytes=s.max_message_bytes, security=s.cloud_security)
            if s.cloud else None
        )
        self.agent = EdgeAgent(
            source=source,
            draft=draft,
            link=self._link,
            adapter=adapter,
            acceptance_prior=s.acceptance_prior,
            default_jpeg_quality=s.default_jpeg_quality,
            request_timeout_s=s.request_timeout_s,
            rpc_timeout_s=s.rpc_timeout_s,
            preview_every=s.preview_every,
            force_speculation=s.speculation == "always",
        )
        servicer = EdgeAgentServicer(
            self.agent, draft_model_id=draft.model_id,
            adapter_id=str(s.adapter) if s.adapter else ("in-memory" if adapter else ""),
        )
        edge_pb2_grpc.add_EdgeAgentServicer_to_server(servicer, host.server)
        self.port = await host.start(s.host, s.port)
        self._host = host
        await self.agent.warm_up()
        if self._link is not None:
            try:
                info = await self._link.server_info(s.rpc_timeout_s)
                log.info("cloud %s reachable: %s", s.cloud, info.model_id)
                warn_on_vocab_mismatch(s.cloud or "", info.vocab_fingerprint,
                                       draft.vocab_fingerprint)
            except EventSpecError as exc:
                log.warning("cloud not reachable yet (%s); will retry per request", exc)
        await host.set_serving(True)
        log.info("edge agent SERVING on %s:%d, source %s, draft %s", s.host, self.port,
                 source.describe(), draft.model_id)
        return self.port

    async def stop(self, grace_s: float | None = None) -> None:
        if self._host is None:
            return
        await self._host.stop(self.settings.grace_s if grace_s is None else grace_s)
        if self._link is not None:
            await self._link.close()
        if self.agent is not None:
            self.agent.worker.shutdown()
        close = getattr(self._owned_source, "close", None)
        if callable(close):
            await asyncio.to_thread(close)
        self._host = None
