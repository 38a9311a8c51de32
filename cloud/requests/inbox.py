"""The edge's messages after Open, and the visual input the prefill waits for.

A reader task runs :meth:`Inbox.consume` for the whole stream, so drafts reach the
scheduler while the model works, a cancel lands at once, and aligned features are
reassembled chunk by chunk; :func:`visual_input` is what the stream awaits before it
submits the prefill. Kept apart from the stream's flow (``eventspec.cloud.requests.generation``):
this is the inbound half, which runs concurrently with it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import torch

from eventspec.cloud.requests.timeline import CloudTimeline
from eventspec.cloud.requests.timeouts import features_timeout_s
from eventspec.cloud.runtime import VerifierRuntime
from eventspec.cloud.scheduling.tickets import Failure, Ticket
from eventspec.cloud.speculation.decoding import check_tail
from eventspec.cloud.speculation.tree_checks import TreeChecks
from eventspec.shared.contract.codec import TensorHeaderInfo, WireDtype
from eventspec.shared.contract.convert_verifier import EdgeInbound
from eventspec.shared.contract.errors import (
    DeadlineExceeded,
    EventSpecError,
    FailedPrecondition,
    InvalidInput,
    ResourceExhausted,
)
from eventspec.shared.contract.tensor_assembly import TensorAssembler
from eventspec.shared.contract.types import (
    UPLOAD_STAGE,
    VIDEO_FEATURES_TENSOR,
    CancelRequest,
    DraftTail,
    OpenRequest,
    TensorChunkData,
)

if TYPE_CHECKING:
    from eventspec.cloud.metrics import RequestProbe


class Inbox:
    """Consumes the edge's messages after Open; feeds drafts, tensors and cancels."""

    #: Counts received drafts for the metrics, when they are on.
    probe: RequestProbe | None = None
    #: Logs received drafts, when Open asked for the request's timeline.
    timeline: CloudTimeline | None = None

    def __init__(self, ticket: Ticket, open_req: OpenRequest, rt: VerifierRuntime) -> None:
        self.ticket = ticket
        self.open = open_req
        self.rt = rt
        self.features_ready = asyncio.Event()
        self.features: torch.Tensor | None = None
        self._assembler: TensorAssembler | None = None
        self._header_at = 0.0  # perf_counter when the features' header arrived
        self.cancelled = False
        self.finished = False
        self.error: EventSpecError | None = None
        #: How much of C the stream has received from the scheduler (>= what the edge saw).
        self.received = 0
        limits = rt.info.limits
        #: The request's tree bookkeeping (ids, parents, depths, live nodes).
        self.trees = TreeChecks(max_nodes=limits.max_tree_nodes, max_depth=limits.max_tree_depth,
                                max_per_message=limits.max_draft_tokens,
                                text_vocab_size=rt.info.text_vocab_size)

    async def consume(self, messages: AsyncIterator[EdgeInbound]) -> None:
        """Handle every message until the edge half-closes; an invalid one fails the stream."""
        try:
            async for msg in messages:
                if self.finished and isinstance(msg, DraftTail):
                    continue  # late drafts after the answer ended: nothing to verify
                self._handle(msg)
        except EventSpecError as exc:
            self.fail(exc)
        finally:
            self.features_ready.set()

    def fail(self, error: EventSpecError) -> None:
        """End the stream with ``error`` at its next wait (also the TTL sweep's way)."""
        if self.error is None:
            self.error = error
        self.ticket.events.put_nowait(Failure(error))
        self.features_ready.set()

    def expire(self, message: str) -> None:
        """End the request with DEADLINE_EXCEEDED (the TTL sweep)."""
        self.fail(DeadlineExceeded(message))

    def _handle(self, msg: EdgeInbound) -> None:
        if isinstance(msg, DraftTail):
            limits = self.rt.info.limits
            check_tail(msg, committed_len=self.received, max_draft_tokens=limits.max_draft_tokens,
                       text_vocab_size=self.rt.info.text_vocab_size)
            if msg.nodes:
                msg = self.trees.check(msg, self.received)
            self.rt.scheduler.offer(self.ticket, msg)
            if self.probe is not None:
                self.probe.on_drafts(msg)
            if self.timeline is not None:
                self.timeline.on_drafts(msg)
        elif isinstance(msg, CancelRequest):
            self.cancelled = True
            self.rt.scheduler.cancel(self.ticket)
            self.features_ready.set()  # stop waiting for aligned features
        elif isinstance(msg, TensorHeaderInfo):
            self._on_header(msg)
        elif isinstance(msg, TensorChunkData):
            self._on_chunk(msg)
        elif isinstance(msg, OpenRequest):
            raise FailedPrecondition("a second Open arrived on the same Generate stream")
        else:
            raise InvalidInput(f"unexpected message {type(msg).__name__}")

    def _on_header(self, header: TensorHeaderInfo) -> None:
        spec = self.open.aligned
        if spec is None:
            raise InvalidInput(
                f"tensor {header.name!r} sent, but Open declared frames, not aligned features"
            )
        if self._assembler is not None or self.features is not None:
            raise InvalidInput(f"a second tensor header ({header.name!r}) arrived")
        geometry = self.rt.info.geometry
        if tuple(header.shape) != geometry.feature_shape:
            raise InvalidInput(
                f"aligned features have shape {list(header.shape)}, but this verifier "
                f"expects {list(geometry.feature_shape)} (GetServerInfo.geometry)"
            )
        cap = self.rt.info.limits.max_tensor_bytes
        size = math.prod(header.shape) * header.dtype.itemsize
        if size > cap:
            raise ResourceExhausted(
                f"tensor {header.name!r}: {size} bytes exceed the limit of "
                f"{cap} bytes (GetServerInfo.limits.max_tensor_bytes); send int8 or fp16"
            )
        self._header_at = time.perf_counter()
        self._assembler = TensorAssembler(
            header,
            max_bytes=cap,
            expected_name=VIDEO_FEATURES_TENSOR,
            expected_shape=geometry.feature_shape,
            expected_dtype=WireDtype[spec.dtype.upper()],
        )

    def _on_chunk(self, chunk: TensorChunkData) -> None:
        if self._assembler is None:
            raise InvalidInput(f"tensor chunk {chunk.index} of {chunk.name!r} before its header")
        self._assembler.add_chunk(chunk.index, chunk.data, name=chunk.name)
        if self._assembler.done:
            feats = torch.from_numpy(self._assembler.finish_float32())  # [F, T, D] float32
            if not bool(torch.isfinite(feats).all()):
                bad = int((~torch.isfinite(feats)).sum())
                raise InvalidInput(f"aligned features contain {bad} NaN or inf values")
            self.features = feats
            self._assembler = None
            self.ticket.session.counters.add_stage(
                UPLOAD_STAGE, (time.perf_counter() - self._header_at) * 1e3)
            self.features_ready.set()



async def visual_input(
    rt: VerifierRuntime, open_req: OpenRequest, inbox: Inbox
) -> dict[str, Any] | None:
    """The prefill's visual kwargs (preprocessed frames or the received features), or
    None when the request was cancelled before its features arrived."""
    if open_req.frames is not None:
        frames = open_req.frames
        pixels = await asyncio.to_thread(rt.target.preprocess_frames, frames)  # [1,F,3,S,S]
        return {"pixel_values_videos": pixels}
    declared = _declared_feature_bytes(open_req)
    uplink = open_req.edge_cost.uplink_bytes_per_s if open_req.edge_cost is not None else 0.0
    timeout = features_timeout_s(declared, uplink, base_s=rt.settings.features_base_timeout_s,
                                 max_s=rt.settings.input_timeout_s)
    if open_req.deadline_ms > 0:
        timeout = min(timeout, open_req.deadline_ms / 1e3)
    try:
        await asyncio.wait_for(inbox.features_ready.wait(), timeout=timeout)
    except TimeoutError:
        raise DeadlineExceeded(
            f"aligned features did not arrive within {timeout:.1f} s of Open (the "
            f"features timeout for {declared} declared bytes at an uplink of "
            f"{uplink:.0f} B/s; 0 = unknown)"
        ) from None
    if inbox.error is not None:
        raise inbox.error
    if inbox.features is None:
        if inbox.cancelled:
            return None  # Done(CANCELLED) without a prefill
        raise InvalidInput("the stream ended before the aligned features were complete")
    feats = inbox.features
    if not math.isfinite(float(feats.abs().max())):
        raise InvalidInput("aligned features contain NaN or inf values")
    return {"video_features": feats}


def _declared_feature_bytes(open_req: OpenRequest) -> int:
    """The aligned tensor's size on the wire, from the shape and dtype Open declared."""
    spec = open_req.aligned
    if spec is None:
        return 0
    return math.prod(spec.shape) * WireDtype[spec.dtype.upper()].itemsize

