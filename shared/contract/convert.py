"""Protobuf <-> domain conversion. The only place (besides transports) that sees pb types."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeVar

from eventspec.shared.contract.codec import TensorHeaderInfo, WireDtype
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.timeline import MAX_EVENTS, Timeline, TimelineEvent
from eventspec.shared.contract.timing import CloudCost, EdgeCost, TimingPlan
from eventspec.shared.contract.types import (
    AlignedSpec,
    AskEvent,
    AskSpec,
    CancelRequest,
    CommitEvent,
    CommittedEvent,
    DoneEvent,
    DraftTail,
    FeatureMode,
    FinalEvent,
    FinishReason,
    GenerationSettings,
    Mode,
    OpenRequest,
    PreviewEvent,
    ProgressEvent,
    RequestStats,
    ServerInfo,
    ServerLimits,
    TensorChunkData,
    VerifierStats,
    VisualGeometry,
    WindowInfo,
)
from eventspec.shared.pb.eventspec.v1 import common_pb2, edge_pb2, verifier_pb2

T = TypeVar("T")


def _copy_fields(src: Any, cls: type[T]) -> T:
    """Build dataclass ``cls`` from same-named attributes of ``src``."""
    return cls(**{f.name: getattr(src, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


def _finite_fields(obj: Any, what: str) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInput(f"{what}.{f.name} must be finite, got {value}")


# -- generation ---------------------------------------------------------------------------


def generation_to_pb(g: GenerationSettings) -> common_pb2.GenerationConfig:
    return common_pb2.GenerationConfig(
        max_new_tokens=g.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        seed=g.seed,
        stop=list(g.stop),
    )


def generation_from_pb(m: common_pb2.GenerationConfig) -> GenerationSettings:
    return GenerationSettings(
        max_new_tokens=m.max_new_tokens,
        temperature=m.temperature,
        top_p=m.top_p,
        seed=m.seed,
        stop=tuple(m.stop),
    )


# -- costs and plans ----------------------------------------------------------------------


def cloud_cost_to_pb(c: CloudCost) -> common_pb2.CloudProfile:
    return common_pb2.CloudProfile(**dataclasses.asdict(c))


def cloud_cost_from_pb(m: common_pb2.CloudProfile) -> CloudCost:
    return _copy_fields(m, CloudCost)


def edge_cost_to_pb(e: EdgeCost) -> common_pb2.EdgeProfile:
    return common_pb2.EdgeProfile(**dataclasses.asdict(e))


def edge_cost_from_pb(m: common_pb2.EdgeProfile) -> EdgeCost:
    cost = _copy_fields(m, EdgeCost)
    _finite_fields(cost, "edge_profile")
    return cost


def plan_to_pb(p: TimingPlan) -> common_pb2.Plan:
    return common_pb2.Plan(**dataclasses.asdict(p))


def plan_from_pb(m: common_pb2.Plan) -> TimingPlan:
    return _copy_fields(m, TimingPlan)


# -- statistics ---------------------------------------------------------------------------


def stats_to_pb(s: RequestStats) -> common_pb2.Stats:
    return common_pb2.Stats(
        drafted=s.drafted,
        accepted=s.accepted,
        acceptance_rate=s.acceptance_rate,
        mean_accepted_length=s.mean_accepted_length,
        hidden_drafted=s.hidden_drafted,
        hidden_accepted=s.hidden_accepted,
        target_steps=s.target_steps,
        ttft_ms=s.ttft_ms,
        total_ms=s.total_ms,
        uplink_bytes=s.uplink_bytes,
        downlink_bytes=s.downlink_bytes,
        stage_ms=dict(s.stage_ms),
        new_tokens=s.new_tokens,
        stale_drafts=s.stale_drafts,
    )


def stats_from_pb(m: common_pb2.Stats) -> RequestStats:
    return RequestStats(
        drafted=m.drafted,
        accepted=m.accepted,
        hidden_drafted=m.hidden_drafted,
        hidden_accepted=m.hidden_accepted,
        target_steps=m.target_steps,
        ttft_ms=m.ttft_ms,
        total_ms=m.total_ms,
        uplink_bytes=m.uplink_bytes,
        downlink_bytes=m.downlink_bytes,
        new_tokens=m.new_tokens,
        stale_drafts=m.stale_drafts,
        stage_ms=dict(m.stage_ms),
    )


# -- tensors ------------------------------------------------------------------------------


def header_to_pb(h: TensorHeaderInfo) -> common_pb2.TensorHeader:
    return common_pb2.TensorHeader(
        name=h.name,
        dtype=h.dtype.value,  # type: ignore[arg-type]
        shape=list(h.shape),
        total_bytes=h.total_bytes,
        crc32=h.crc32,
        num_chunks=h.num_chunks,
        scale=h.scale,
    )


def header_from_pb(m: common_pb2.TensorHeader) -> TensorHeaderInfo:
    try:
        dtype = WireDtype(m.dtype)
    except ValueError:
        raise InvalidInput(
            f"tensor {m.name!r}: unknown or unspecified dtype {m.dtype}"
        ) from None
    return TensorHeaderInfo(
        name=m.name,
        dtype=dtype,
        shape=tuple(int(d) for d in m.shape),
        total_bytes=m.total_bytes,
        crc32=m.crc32,
        num_chunks=m.num_chunks,
        scale=m.scale,
    )


# -- server info --------------------------------------------------------------------------


def server_info_to_pb(i: ServerInfo) -> verifier_pb2.ServerInfo:
    g, lim = i.geometry, i.limits
    return verifier_pb2.ServerInfo(
        protocol=i.protocol,
        model_id=i.model_id,
        vocab_size=i.vocab_size,
        text_vocab_size=i.text_vocab_size,
        vocab_fingerprint=i.vocab_fingerprint,
        eos_token_id=i.eos_token_id,
        geometry=verifier_pb2.VisualGeometry(**dataclasses.asdict(g)),
        feature_modes=[int(m) for m in i.feature_modes],  # type: ignore[misc]
        profile=cloud_cost_to_pb(i.cloud_cost),
        limits=verifier_pb2.Limits(**dataclasses.asdict(lim)),
        prompt_overhead_tokens=i.prompt_overhead_tokens,
    )


def server_info_from_pb(m: verifier_pb2.ServerInfo) -> ServerInfo:
    return ServerInfo(
        model_id=m.model_id,
        vocab_size=m.vocab_size,
        text_vocab_size=m.text_vocab_size,
        vocab_fingerprint=m.vocab_fingerprint,
        eos_token_id=m.eos_token_id,
        geometry=_copy_fields(m.geometry, VisualGeometry),
        feature_modes=tuple(FeatureMode(v) for v in m.feature_modes),
        cloud_cost=cloud_cost_from_pb(m.profile),
        limits=_copy_fields(m.limits, ServerLimits),
        prompt_overhead_tokens=m.prompt_overhead_tokens,
        protocol=m.protocol,
    )


def verifier_stats_to_pb(s: VerifierStats) -> verifier_pb2.VerifierStats:
    fields = dataclasses.asdict(s)
    by_principal = fields.pop("sessions_by_principal")
    msg = verifier_pb2.VerifierStats(**fields)
    msg.sessions_by_principal.update(by_principal)
    return msg


def verifier_stats_from_pb(m: verifier_pb2.VerifierStats) -> VerifierStats:
    plain = {f.name: getattr(m, f.name) for f in dataclasses.fields(VerifierStats)
             if f.name != "sessions_by_principal"}
    return VerifierStats(**plain, sessions_by_principal=dict(m.sessions_by_principal))


# -- the Generate stream ------------------------------------------------------------------


def open_to_pb(o: OpenRequest) -> verifier_pb2.Open:
    msg = verifier_pb2.Open(
        request_id=o.request_id,
        question=o.question,
        generation=generation_to_pb(o.generation),
        deadline_ms=o.deadline_ms,
        speculative=o.speculative,
        timeline=o.timeline,
    )
    if o.frames is not None:
        msg.frames.frames.extend(o.frames)
    if o.aligned is not None:
        msg.aligned.dtype = WireDtype.from_name(o.aligned.dtype).value  # type: ignore[assignment]
        msg.aligned.shape.extend(o.aligned.shape)
    if o.edge_cost is not None:
        msg.edge_profile.CopyFrom(edge_cost_to_pb(o.edge_cost))
    return msg


def open_from_pb(m: verifier_pb2.Open) -> OpenRequest:
    """Convert and check the parts that need no server context."""
    kind = m.WhichOneof("visual")
    if kind is None:
        raise InvalidInput("Open has no visual input: set `frames` or `aligned`")
    frames = tuple(m.frames.frames) if kind == "frames" else None
    aligned = None
    if kind == "aligned":
        try:
            wire = WireDtype(m.aligned.dtype)
        except ValueError:
            raise InvalidInput(f"Open.aligned has unknown dtype {m.aligned.dtype}") from None
        aligned = AlignedSpec(dtype=wire.label, shape=tuple(m.aligned.shape))
    if m.deadline_ms < 0:
        raise InvalidInput(f"deadline_ms must be >= 0, got {m.deadline_ms}")
    return OpenRequest(
        request_id=m.request_id,
        question=m.question,
        generation=generation_from_pb(m.generation),
        frames=frames,
        aligned=aligned,
        edge_cost=edge_cost_from_pb(m.edge_profile) if m.HasField("edge_profile") else None,
        deadline_ms=m.deadline_ms,
        speculative=m.speculative,
        timeline=m.timeline,
    )


def timeline_to_pb(t: Timeline) -> common_pb2.Timeline:
    return common_pb2.Timeline(
        events=[common_pb2.TimelineEvent(**dataclasses.asdict(e)) for e in t.events],
        dropped=t.dropped, cloud_offset_ms=t.cloud_offset_ms, clock_sync=t.clock_sync,
    )


def timeline_from_pb(m: common_pb2.Timeline, limit: int = MAX_EVENTS) -> Timeline:
    """Convert, keeping at most ``limit`` events (the rest count as dropped): a peer's
    log is bounded here whatever it sent."""
    events = tuple(_copy_fields(e, TimelineEvent) for e in m.events[:limit])
    return Timeline(events, max(0, m.dropped) + max(0, len(m.events) - limit),
                    m.cloud_offset_ms, m.clock_sync)


def drafts_to_pb(d: DraftTail) -> verifier_pb2.Drafts:
    return verifier_pb2.Drafts(base=d.base, token_ids=list(d.token_ids), sent_at_ms=d.sent_at_ms)


def drafts_from_pb(m: verifier_pb2.Drafts) -> DraftTail:
    return DraftTail(base=m.base, token_ids=tuple(m.token_ids), sent_at_ms=m.sent_at_ms)


def commit_to_pb(c: CommitEvent) -> verifier_pb2.Commit:
    return verifier_pb2.Commit(
        start=c.start,
        token_ids=list(c.token_ids),
        drafts_verified=c.drafts_verified,
        drafts_accepted=c.drafts_accepted,
        text=c.text,
        at_ms=c.at_ms,
    )


def commit_from_pb(m: verifier_pb2.Commit) -> CommitEvent:
    return CommitEvent(
        start=m.start,
        token_ids=tuple(m.token_ids),
        drafts_verified=m.drafts_verified,
        drafts_accepted=m.drafts_accepted,
        text=m.text,
        at_ms=m.at_ms,
    )


def done_to_pb(d: DoneEvent) -> verifier_pb2.Done:
    msg = verifier_pb2.Done(
        finish_reason=int(d.finish_reason),  # type: ignore[arg-type]
        token_ids=list(d.token_ids),
        text=d.text,
        stats=stats_to_pb(d.stats),
    )
    if d.final_plan is not None:
        msg.final_plan.CopyFrom(plan_to_pb(d.final_plan))
    if d.timeline is not None:
        msg.timeline.CopyFrom(timeline_to_pb(d.timeline))
    return msg


def done_from_pb(m: verifier_pb2.Done) -> DoneEvent:
    return DoneEvent(
        finish_reason=FinishReason(m.finish_reason),
        token_ids=tuple(m.token_ids),
        text=m.text,
        stats=stats_from_pb(m.stats),
        final_plan=plan_from_pb(m.final_plan) if m.HasField("final_plan") else None,
        timeline=timeline_from_pb(m.timeline) if m.HasField("timeline") else None,
    )


# -- stream envelopes ---------------------------------------------------------------------

EdgeInbound = OpenRequest | TensorHeaderInfo | TensorChunkData | DraftTail | CancelRequest
CloudOutbound = TimingPlan | CommitEvent | DoneEvent


def edge_message_from_pb(m: verifier_pb2.EdgeMessage) -> EdgeInbound:
    """Unwrap one EdgeMessage; an empty envelope is InvalidInput."""
    kind = m.WhichOneof("kind")
    if kind == "open":
        return open_from_pb(m.open)
    if kind == "tensor_header":
        return header_from_pb(m.tensor_header)
    if kind == "tensor_chunk":
        c = m.tensor_chunk
        return TensorChunkData(name=c.name, index=c.index, data=c.data)
    if kind == "drafts":
        return drafts_from_pb(m.drafts)
    if kind == "cancel":
        return CancelRequest(reason=m.cancel.reason)
    raise InvalidInput("EdgeMessage has no content (none of open/tensor/drafts/cancel set)")


def edge_message_to_pb(msg: EdgeInbound) -> verifier_pb2.EdgeMessage:
    if isinstance(msg, OpenRequest):
        return verifier_pb2.EdgeMessage(open=open_to_pb(msg))
    if isinstance(msg, TensorHeaderInfo):
        return verifier_pb2.EdgeMessage(tensor_header=header_to_pb(msg))
    if isinstance(msg, TensorChunkData):
        return verifier_pb2.EdgeMessage(
            tensor_chunk=common_pb2.TensorChunk(name=msg.name, index=msg.index, data=msg.data)
        )
    if isinstance(msg, DraftTail):
        return verifier_pb2.EdgeMessage(drafts=drafts_to_pb(msg))
    return verifier_pb2.EdgeMessage(cancel=verifier_pb2.Cancel(reason=msg.reason))


def cloud_message_to_pb(msg: CloudOutbound) -> verifier_pb2.CloudMessage:
    if isinstance(msg, TimingPlan):
        return verifier_pb2.CloudMessage(plan=plan_to_pb(msg))
    if isinstance(msg, CommitEvent):
        return verifier_pb2.CloudMessage(commit=commit_to_pb(msg))
    return verifier_pb2.CloudMessage(done=done_to_pb(msg))


def cloud_message_from_pb(m: verifier_pb2.CloudMessage) -> CloudOutbound:
    kind = m.WhichOneof("kind")
    if kind == "plan":
        return plan_from_pb(m.plan)
    if kind == "commit":
        return commit_from_pb(m.commit)
    if kind == "done":
        return done_from_pb(m.done)
    raise InvalidInput("CloudMessage has no content")


# -- EdgeAgent.Ask ------------------------------------------------------------------------


def ask_spec_to_pb(s: AskSpec) -> edge_pb2.AskRequest:
    window = edge_pb2.Window(event_window_ms=s.event_window_ms)
    if s.t0_us is not None and s.t1_us is not None:
        window.range.CopyFrom(edge_pb2.TimeRange(t0_us=s.t0_us, t1_us=s.t1_us))
    elif s.latest_ms is not None:
        window.latest_ms = s.latest_ms
    return edge_pb2.AskRequest(
        question=s.question,
        window=window,
        mode=int(s.mode),  # type: ignore[arg-type]
        generation=generation_to_pb(s.generation),
        feature_mode=int(s.feature_mode),  # type: ignore[arg-type]
        jpeg_quality=s.jpeg_quality,
        timeline=s.timeline,
    )


def ask_spec_from_pb(m: edge_pb2.AskRequest) -> AskSpec:
    """Convert an AskRequest, filling defaults for unset fields."""
    clip = m.window.WhichOneof("clip")
    latest_ms: int | None = None
    t0 = t1 = None
    if clip == "latest_ms":
        latest_ms = m.window.latest_ms
        if latest_ms <= 0:
            raise InvalidInput(f"window.latest_ms must be positive, got {latest_ms}")
    elif clip == "range":
        latest_ms, t0, t1 = None, m.window.range.t0_us, m.window.range.t1_us
    if not 0 <= m.jpeg_quality <= 100:
        raise InvalidInput(f"jpeg_quality must be in 1..100 (0 = default), got {m.jpeg_quality}")
    try:
        mode = Mode(m.mode) if m.mode else Mode.SPECULATIVE
        feature_mode = FeatureMode(m.feature_mode) if m.feature_mode else FeatureMode.AUTO
    except ValueError as exc:
        raise InvalidInput(f"unknown enum value in AskRequest: {exc}") from None
    return AskSpec(
        question=m.question,
        latest_ms=latest_ms,
        t0_us=t0,
        t1_us=t1,
        event_window_ms=m.window.event_window_ms or 50,
        mode=mode,
        generation=generation_from_pb(m.generation),
        feature_mode=feature_mode,
        jpeg_quality=m.jpeg_quality,
        timeline=m.timeline,
    )


def ask_event_to_pb(e: AskEvent) -> edge_pb2.AskResponse:
    if isinstance(e, ProgressEvent):
        return edge_pb2.AskResponse(
            progress=edge_pb2.Progress(stage=e.stage, message=e.message, waited_s=e.waited_s)
        )
    if isinstance(e, PreviewEvent):
        return edge_pb2.AskResponse(
            preview=edge_pb2.Preview(base=e.base, token_ids=list(e.token_ids), text=e.text)
        )
    if isinstance(e, CommittedEvent):
        return edge_pb2.AskResponse(
            committed=edge_pb2.Committed(start=e.start, token_ids=list(e.token_ids), text=e.text)
        )
    final = edge_pb2.Final(
        answer=e.answer,
        token_ids=list(e.token_ids),
        mode=int(e.mode),  # type: ignore[arg-type]
        feature_mode=int(e.feature_mode or 0),  # type: ignore[arg-type]
        finish_reason=int(e.finish_reason),  # type: ignore[arg-type]
        stats=stats_to_pb(e.stats),
    )
    if e.plan is not None:
        final.plan.CopyFrom(plan_to_pb(e.plan))
    if e.window is not None:
        final.window.CopyFrom(edge_pb2.WindowInfo(**dataclasses.asdict(e.window)))
    if e.timeline is not None:
        final.timeline.CopyFrom(timeline_to_pb(e.timeline))
    return edge_pb2.AskResponse(final=final)


def ask_event_from_pb(m: edge_pb2.AskResponse) -> AskEvent:
    kind = m.WhichOneof("kind")
    if kind == "preview":
        return PreviewEvent(m.preview.base, tuple(m.preview.token_ids), m.preview.text)
    if kind == "committed":
        c = m.committed
        return CommittedEvent(c.start, tuple(c.token_ids), c.text)
    if kind == "progress":
        return ProgressEvent(m.progress.stage, m.progress.message, m.progress.waited_s)
    if kind != "final":
        raise InvalidInput("AskResponse has no content")
    f = m.final
    return FinalEvent(
        answer=f.answer,
        token_ids=tuple(f.token_ids),
        mode=Mode(f.mode),
        feature_mode=FeatureMode(f.feature_mode) if f.feature_mode else None,
        finish_reason=FinishReason(f.finish_reason),
        stats=stats_from_pb(f.stats),
        plan=plan_from_pb(f.plan) if f.HasField("plan") else None,
        window=_copy_fields(f.window, WindowInfo) if f.HasField("window") else None,
        timeline=(timeline_from_pb(f.timeline, 2 * MAX_EVENTS) if f.HasField("timeline")
                  else None),
    )
