"""Protobuf <-> domain conversion of the ``Verifier`` service (verifier.proto).

``GetServerInfo`` and ``GetStats`` answers, and the ``Generate`` stream: ``Open``, the
tensor and ``Drafts`` messages the edge sends, the ``Plan``, ``Commit`` and ``Done`` the
cloud answers with, and the two envelopes around them. The pieces these messages share
(settings, costs, stats, tensor headers, timelines) are in
:mod:`eventspec.shared.contract.convert`.
"""

from __future__ import annotations

import dataclasses

from eventspec.shared.contract.codec import TensorHeaderInfo, WireDtype
from eventspec.shared.contract.convert import (
    cloud_cost_from_pb,
    cloud_cost_to_pb,
    copy_fields,
    edge_cost_from_pb,
    edge_cost_to_pb,
    generation_from_pb,
    generation_to_pb,
    header_from_pb,
    header_to_pb,
    plan_from_pb,
    plan_to_pb,
    stats_from_pb,
    stats_to_pb,
    timeline_from_pb,
    timeline_to_pb,
)
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.timing import TimingPlan
from eventspec.shared.contract.types import (
    AlignedSpec,
    CancelRequest,
    CommitEvent,
    DoneEvent,
    DraftNode,
    DraftTail,
    FeatureMode,
    FinishReason,
    OpenRequest,
    ServerInfo,
    ServerLimits,
    TensorChunkData,
    VisualGeometry,
)
from eventspec.shared.contract.verifier_stats import StepKindTimes, VerifierStats
from eventspec.shared.pb.eventspec.v1 import common_pb2, verifier_pb2

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
        geometry=copy_fields(m.geometry, VisualGeometry),
        feature_modes=tuple(FeatureMode(v) for v in m.feature_modes),
        cloud_cost=cloud_cost_from_pb(m.profile),
        limits=copy_fields(m.limits, ServerLimits),
        prompt_overhead_tokens=m.prompt_overhead_tokens,
        protocol=m.protocol,
    )


def verifier_stats_to_pb(s: VerifierStats) -> verifier_pb2.VerifierStats:
    fields = dataclasses.asdict(s)
    by_principal = fields.pop("sessions_by_principal")
    kinds = fields.pop("step_kinds")
    msg = verifier_pb2.VerifierStats(**fields)
    msg.sessions_by_principal.update(by_principal)
    msg.step_kinds.extend(verifier_pb2.StepKindTimes(**k) for k in kinds)
    return msg


def verifier_stats_from_pb(m: verifier_pb2.VerifierStats) -> VerifierStats:
    plain = {f.name: getattr(m, f.name) for f in dataclasses.fields(VerifierStats)
             if f.name not in ("sessions_by_principal", "step_kinds")}
    kinds = tuple(StepKindTimes(**{f.name: getattr(k, f.name)
                                   for f in dataclasses.fields(StepKindTimes)})
                  for k in m.step_kinds)
    return VerifierStats(**plain, sessions_by_principal=dict(m.sessions_by_principal),
                         step_kinds=kinds)


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



def drafts_to_pb(d: DraftTail) -> verifier_pb2.Drafts:
    """A chain as ``token_ids``; a tree's nodes as the parallel columns, which the cloud
    decodes in a few array copies instead of a message per node."""
    if not d.nodes:
        return verifier_pb2.Drafts(base=d.base, token_ids=list(d.token_ids),
                                   sent_at_ms=d.sent_at_ms)
    ids, parents, tokens, logprobs = zip(*d.nodes, strict=True)
    return verifier_pb2.Drafts(base=d.base, token_ids=list(d.token_ids),
                               sent_at_ms=d.sent_at_ms, node_ids=ids, node_parents=parents,
                               node_tokens=tokens, node_logprobs=logprobs)


#: The columns of a packed tree, in ``DraftNode`` field order.
_COLUMNS = ("node_ids", "node_parents", "node_tokens", "node_logprobs")


def drafts_from_pb(m: verifier_pb2.Drafts) -> DraftTail:
    """Either form of a tree becomes ``DraftNode`` tuples; columns of unequal length, or
    both forms in one message, are InvalidInput naming the fields."""
    if not m.node_ids and not m.node_parents and not m.node_tokens and not m.node_logprobs:
        return DraftTail(base=m.base, token_ids=tuple(m.token_ids), sent_at_ms=m.sent_at_ms,
                         nodes=tuple(DraftNode(n.id, n.parent, n.token_id, n.logprob)
                                     for n in m.nodes))
    if m.nodes:
        raise InvalidInput("Drafts carries both nodes and the node_ids columns; send one")
    n = len(m.node_ids)
    logprobs = m.node_logprobs if len(m.node_logprobs) else [0.0] * n
    for name in _COLUMNS:
        got = len(getattr(m, name)) if name != "node_logprobs" else len(logprobs)
        if got != n:
            raise InvalidInput(f"Drafts.{name} has {got} entries, Drafts.node_ids {n}: the "
                               "columns of a tree have one entry per node")
    return DraftTail(base=m.base, token_ids=tuple(m.token_ids), sent_at_ms=m.sent_at_ms,
                     nodes=tuple(map(DraftNode, m.node_ids, m.node_parents, m.node_tokens,
                                     logprobs)), columns=True)


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
