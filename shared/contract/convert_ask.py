"""Protobuf <-> domain conversion of the ``EdgeAgent.Ask`` call (edge.proto).

A client's ``AskRequest`` and the ``AskResponse`` stream it reads (progress, previews,
committed text, the final answer). The pieces these messages share with the
``Verifier`` service (settings, stats, plans, timelines) are in
:mod:`eventspec.shared.contract.convert`.
"""

from __future__ import annotations

import dataclasses

from eventspec.shared.contract.convert import (
    copy_fields,
    generation_from_pb,
    generation_to_pb,
    plan_from_pb,
    plan_to_pb,
    stats_from_pb,
    stats_to_pb,
    timeline_from_pb,
    timeline_to_pb,
)
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.timeline import MAX_EVENTS
from eventspec.shared.contract.types import (
    AskEvent,
    AskSpec,
    CommittedEvent,
    FeatureMode,
    FinalEvent,
    FinishReason,
    Mode,
    PreviewEvent,
    ProgressEvent,
    WindowInfo,
)
from eventspec.shared.pb.eventspec.v1 import edge_pb2


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
        window=copy_fields(f.window, WindowInfo) if f.HasField("window") else None,
        timeline=(timeline_from_pb(f.timeline, 2 * MAX_EVENTS) if f.HasField("timeline")
                  else None),
    )
