"""One Generate stream, end to end, over domain types (no protobuf, no gRPC).

The servicer converts wire messages to domain messages and back; this module owns the
order of events: Open, the visual input, Plan, prefill (while hidden drafts arrive),
then the commits of the steps that verify whatever valid drafts extend C, then Done. A
reader task consumes the edge's messages concurrently, so drafts land while the model
works. The stream talks only to the scheduler (``eventspec.cloud.scheduler``): it never calls the
engine, and it never reads the session while the engine thread owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from eventspec.cloud.decoding import Committed, DecodingSession, check_tail
from eventspec.cloud.request_log import RequestRecord
from eventspec.cloud.request_timeline import CloudTimeline
from eventspec.cloud.runtime import VerifierRuntime
from eventspec.cloud.scheduler import Failure, Ticket
from eventspec.cloud.timeouts import features_timeout_s
from eventspec.shared.contract.codec import TensorHeaderInfo, WireDtype
from eventspec.shared.contract.convert_verifier import CloudOutbound, EdgeInbound
from eventspec.shared.contract.errors import (
    DeadlineExceeded,
    EventSpecError,
    FailedPrecondition,
    InvalidInput,
    ResourceExhausted,
)
from eventspec.shared.contract.principal import current_principal
from eventspec.shared.contract.tensor_assembly import TensorAssembler
from eventspec.shared.contract.types import (
    VIDEO_FEATURES_TENSOR,
    CancelRequest,
    CommitEvent,
    DoneEvent,
    DraftTail,
    FinishReason,
    OpenRequest,
    TensorChunkData,
)
from eventspec.shared.node.imageproc import frame_size
from eventspec.shared.node.logsafe import safe_request_id
from eventspec.shared.node.tracing import (
    CLOUD_SPANS,
    RequestSpan,
    final_attributes,
    incoming_metadata,
)

if TYPE_CHECKING:
    from eventspec.cloud.metrics import RequestProbe

log = logging.getLogger(__name__)


@dataclass
class ByteCounter:
    """Serialized bytes each way, filled in by the transport."""

    uplink: int = 0
    downlink: int = 0


def _describe(msg: object) -> str:
    return type(msg).__name__


class _Inbox:
    """Consumes the edge's messages after Open; feeds drafts, tensors and cancels."""

    #: Counts received drafts for the metrics, when they are on.
    probe: RequestProbe | None = None
    #: Logs received drafts, when Open asked for the request's timeline.
    timeline: CloudTimeline | None = None

    def __init__(self, ticket: Ticket, open_req: OpenRequest, rt: VerifierRuntime):
        self.ticket = ticket
        self.open = open_req
        self.rt = rt
        self.features_ready = asyncio.Event()
        self.features: torch.Tensor | None = None
        self._assembler: TensorAssembler | None = None
        self.cancelled = False
        self.finished = False
        self.error: EventSpecError | None = None
        #: How much of C the stream has received from the scheduler (>= what the edge saw).
        self.received = 0

    async def consume(self, messages: AsyncIterator[EdgeInbound]) -> None:
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
            raise InvalidInput(f"unexpected message {_describe(msg)}")

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
            self.features_ready.set()


def validate_open(open_req: OpenRequest, rt: VerifierRuntime) -> OpenRequest:
    """Check what needs the server's geometry and limits; return with settings filled."""
    if not open_req.question.strip():
        raise InvalidInput("question is empty")
    cap = rt.info.limits.max_question_chars
    if len(open_req.question) > cap:
        raise InvalidInput(
            f"Open.question: {len(open_req.question)} characters exceed the cap of {cap} "
            "(GetServerInfo.limits.max_question_chars)"
        )
    info = rt.info
    settings = open_req.generation.validated(info.limits.max_new_tokens,
                                             max_stop_strings=info.limits.max_stop_strings,
                                             max_stop_chars=info.limits.max_stop_chars)
    if open_req.frames is not None:
        n = len(open_req.frames)
        if n != info.geometry.num_frames:
            raise InvalidInput(
                f"frames clip has {n} frames; this verifier needs exactly "
                f"{info.geometry.num_frames}"
            )
        for i, frame in enumerate(open_req.frames):
            if len(frame) > info.limits.max_frame_bytes:
                raise ResourceExhausted(
                    f"frame {i} is {len(frame)} bytes, over the cap of "
                    f"{info.limits.max_frame_bytes}"
                )
            try:
                frame_size(frame)  # the header alone: pixel count and aspect ratio
            except InvalidInput as exc:
                raise InvalidInput(f"frame {i}: {exc.message}") from exc
    if open_req.aligned is not None:
        if tuple(open_req.aligned.shape) != info.geometry.feature_shape:
            raise InvalidInput(
                f"Open declares aligned features of shape {list(open_req.aligned.shape)}, "
                f"but this verifier expects {list(info.geometry.feature_shape)}"
            )
        if open_req.aligned.dtype not in ("float32", "float16", "bfloat16", "int8"):
            raise InvalidInput(
                f"aligned features must be float32/float16/bfloat16/int8, "
                f"not {open_req.aligned.dtype}"
            )
    return OpenRequest(
        request_id=safe_request_id(open_req.request_id),
        question=open_req.question,
        generation=settings,
        frames=open_req.frames,
        aligned=open_req.aligned,
        edge_cost=open_req.edge_cost,
        deadline_ms=open_req.deadline_ms,
        speculative=open_req.speculative,
        timeline=open_req.timeline,
    )


async def run_generate(
    rt: VerifierRuntime, messages: AsyncIterator[EdgeInbound], counter: ByteCounter
) -> AsyncIterator[CloudOutbound]:
    """Serve one Generate stream: yields a Plan, Commits, then Done.

    Whatever happens, one INFO line records the request (``eventspec.cloud.request_log``):
    answers, refusals, failures and cancellations alike, never the question.
    """
    record = RequestRecord(principal=str(current_principal()))
    probe = rt.metrics.request(current_principal()) if rt.metrics is not None else None
    span = (RequestSpan.begin(rt.tracer, "Generate", parent_metadata=incoming_metadata())
            if rt.tracer is not None else None)
    done: list[DoneEvent] = []
    try:
        async with contextlib.aclosing(_serve(rt, messages, counter, record, probe,
                                              span)) as events:
            async for event in events:
                if isinstance(event, DoneEvent):
                    done.append(event)
                yield event
    except EventSpecError as exc:
        record.fail(exc.code.name, exc.message)
        if probe is not None:
            probe.on_error(exc)
        raise
    except (asyncio.CancelledError, GeneratorExit):
        record.fail("CANCELLED", "the edge went away")
        if probe is not None:
            probe.on_cancelled()
        raise
    except Exception as exc:
        record.fail("INTERNAL", type(exc).__name__)
        raise
    finally:
        record.log()
        if span is not None:
            span.finish(CLOUD_SPANS, attributes={
                "eventspec.request_id": record.request_id, "eventspec.mode": record.mode,
                **final_attributes(done[0] if done else None)},
                error=None if done else record.outcome)


async def _first_message(rt: VerifierRuntime, messages: AsyncIterator[EdgeInbound]) -> OpenRequest:
    """The stream's Open, within ``first_message_timeout_s`` of the call's start."""
    timeout = rt.settings.first_message_timeout_s
    try:
        first = await asyncio.wait_for(anext(messages), timeout=timeout)
    except StopAsyncIteration:
        raise InvalidInput("the Generate stream ended before its Open message") from None
    except TimeoutError:
        raise DeadlineExceeded(
            f"no Open message within {timeout:g} s of the Generate call (the first-message "
            "timeout); send Open first"
        ) from None
    if not isinstance(first, OpenRequest):
        raise FailedPrecondition(f"the first message must be Open, got {_describe(first)}")
    return first


def clamp_to_context(open_req: OpenRequest, prompt_len: int, max_seq_len: int) -> OpenRequest:
    """``open_req`` with ``max_new_tokens`` no larger than the positions a KV slot has
    left after the prompt, so the Plan states the cap the answer will really meet."""
    room = max_seq_len - prompt_len
    if room < 1:
        raise InvalidInput(
            f"the prompt takes {prompt_len} of this verifier's {max_seq_len} positions per "
            "request, leaving none for the answer; shorten Open.question"
        )
    settings = open_req.generation
    if settings.max_new_tokens <= room:
        return open_req
    return dataclasses.replace(
        open_req, generation=dataclasses.replace(settings, max_new_tokens=room)
    )


async def _serve(
    rt: VerifierRuntime, messages: AsyncIterator[EdgeInbound], counter: ByteCounter,
    record: RequestRecord, probe: RequestProbe | None = None, span: RequestSpan | None = None,
) -> AsyncGenerator[CloudOutbound, None]:
    first = await _first_message(rt, messages)
    record.request_id = safe_request_id(first.request_id)
    record.mode = _mode(first)
    if probe is not None:
        probe.mode = "speculative" if first.speculative else "target_only"
    open_req = validate_open(first, rt)
    prompt_ids = rt.target.build_prompt_ids(open_req.question)
    sched = rt.scheduler
    open_req = clamp_to_context(open_req, len(prompt_ids), sched.engine.max_seq_len)
    settings = open_req.generation

    def make_session(slot: int) -> DecodingSession:
        return DecodingSession(
            settings=settings,
            slot=slot,
            prompt_len=len(prompt_ids),
            max_seq_len=sched.engine.max_seq_len,
            eos_token_id=rt.info.eos_token_id,
            max_verify_tokens=rt.settings.max_verify_tokens,
            decode=rt.target.decode,
            speculative=open_req.speculative,
            deadline_ms=open_req.deadline_ms,
        )

    if probe is not None:
        probe.stage = "sessions"
    key = rt.registry.open(open_req.request_id, _nothing_to_release,  # the session caps
                           principal=current_principal())
    if probe is not None:
        probe.stage = "kv"
    try:
        ticket = sched.admit(open_req.request_id, make_session)  # a KV slot
    except BaseException:
        await rt.registry.close(key)
        raise
    session = ticket.session
    inbox = _Inbox(ticket, open_req, rt)
    if probe is not None:
        probe.stage = "run"
        inbox.probe = probe
    timeline = CloudTimeline(ticket) if open_req.timeline or span is not None else None
    inbox.timeline = timeline
    if span is not None and timeline is not None:  # its stages become the span's children
        span.attach(timeline.log.events, session.started)
    rt.registry.attach(key, _releaser(rt, ticket), inbox.expire)
    reader = asyncio.create_task(inbox.consume(messages))
    try:
        plan, plan_inputs = rt.plan_for(open_req)  # states the clamped max_new_tokens
        yield plan

        visual = await _visual_input(rt, open_req, inbox)
        received: list[int] = []
        finish: FinishReason | None = None
        if visual is None:  # cancelled before the features arrived: no prefill
            finish = FinishReason.CANCELLED
            session.finish(finish)
        else:
            sched.submit_prefill(ticket, prompt_ids, **visual)
        while finish is None:
            event = await ticket.events.get()
            if isinstance(event, Failure):
                raise event.error
            if event.tokens:
                received.extend(event.tokens)
                inbox.received = len(received)
                record.tokens = len(received)
                if probe is not None:
                    probe.on_commit(len(event.tokens), event.verified, event.accepted)
                commit = _commit_event(event, received, rt, session)
                if timeline is not None:
                    timeline.on_committed(event)
                    timeline.on_commit_sent(commit)
                yield commit
            finish = event.finish_reason
        inbox.finished = True
        if not ticket.events.empty():
            pending = ticket.events.get_nowait()
            if isinstance(pending, Failure):
                raise pending.error
        stats = session.stats(counter.uplink, counter.downlink)
        logged = timeline.finish(stats) if timeline is not None else None
        rt.observe(stats, session.counters.rejections)
        done = DoneEvent(
            finish_reason=finish,
            token_ids=tuple(received),
            text=session.visible(rt.target.decode(received), finish),
            stats=stats,
            final_plan=dataclasses.replace(
                rt.replan(plan, plan_inputs, stats, session.counters.rejections),
                max_new_tokens=settings.max_new_tokens,
            ),
            timeline=logged if open_req.timeline else None,
        )
        record.finish(done.finish_reason.name, stats)
        if probe is not None:
            if ticket.prefill_started_at:
                probe.on_prefill(len(prompt_ids), ticket.prefill_started_at - ticket.submitted_at)
            probe.on_done(done.finish_reason.name, stats)
        yield done
        # Keep the stream open until the edge half-closes (bounded), so a Drafts message
        # it wrote while Done was in flight is drained here instead of failing its write
        # and taking the Done with it.
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(reader), timeout=rt.settings.drain_timeout_s)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        await rt.registry.close(key)


def _commit_event(event: Committed, received: list[int], rt: VerifierRuntime,
                  session: DecodingSession) -> CommitEvent:
    return CommitEvent(
        start=event.start,
        token_ids=event.tokens,
        drafts_verified=event.verified,
        drafts_accepted=event.accepted,
        text=session.visible(rt.target.decode(received), event.finish_reason),
        at_ms=session.elapsed_ms(),
    )


async def _nothing_to_release() -> None:
    """A registered request holds nothing until ``SessionRegistry.attach``."""


def _releaser(rt: VerifierRuntime, ticket: Ticket) -> Callable[[], Awaitable[None]]:
    async def release() -> None:
        rt.scheduler.release(ticket)

    return release


async def _visual_input(
    rt: VerifierRuntime, open_req: OpenRequest, inbox: _Inbox
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


def _mode(open_req: OpenRequest) -> str:
    """``speculative`` or ``target_only``, and the visual path, for the request's log."""
    visual = "aligned" if open_req.aligned is not None else "frames"
    return f"{'speculative' if open_req.speculative else 'target_only'}/{visual}"
