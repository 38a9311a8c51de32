"""``eventspec status HOST:PORT``: a node's live state, whichever node it is.

An edge agent answers ``EdgeAgent.GetStatus`` (source, models, link to the cloud, Asks in
flight and waiting, acceptance); a cloud verifier answers ``Verifier.GetStats`` (sessions,
KV slots, queued prefills, acceptance, engine steps). The command asks the edge's method
first and, when the address does not serve it (UNIMPLEMENTED), the cloud's, so one
command works on either port.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from grpc import aio

from eventspec.shared.contract import convert_verifier
from eventspec.shared.contract.verifier_stats import StepKindTimes, VerifierStats
from eventspec.shared.pb.eventspec.v1 import (
    edge_pb2,
    edge_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)
from eventspec.shared.wire.channel import call_metadata, open_channel
from eventspec.shared.wire.options import channel_options
from eventspec.shared.wire.security import ClientSecurity
from eventspec.shared.wire.transport_hint import with_hint


@dataclass(frozen=True)
class NodeStatus:
    """What a node said: ``kind`` is "edge" or "cloud"; ``message`` its answer."""

    kind: str
    message: Message


class StatusError(Exception):
    """The node could not be asked; the message says why."""


async def fetch_status(address: str, *, security: ClientSecurity | None = None,
                       timeout_s: float = 10.0) -> NodeStatus:
    """The node's live state (edge GetStatus, else cloud GetStats)."""
    metadata = call_metadata(security)
    tls = security is not None and security.tls
    channel = open_channel(address, security, channel_options())
    try:
        try:
            edge = await edge_pb2_grpc.EdgeAgentStub(channel).GetStatus(
                edge_pb2.GetStatusRequest(), timeout=timeout_s, metadata=metadata)
            return NodeStatus("edge", edge)
        except aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise StatusError(_why(address, exc, tls=tls)) from None
        try:
            cloud = await verifier_pb2_grpc.VerifierStub(channel).GetStats(
                verifier_pb2.GetStatsRequest(), timeout=timeout_s, metadata=metadata)
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise StatusError(f"{address} serves neither an eventspec edge agent nor a "
                                  "cloud verifier with GetStats") from None
            raise StatusError(_why(address, exc, tls=tls)) from None
        return NodeStatus("cloud", cloud)
    finally:
        await channel.close()


def _why(address: str, exc: aio.AioRpcError, *, tls: bool) -> str:
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return with_hint(f"cannot reach {address}: {exc.details()}", exc.details() or "",
                         tls=tls)
    return f"{address}: {code.name}: {exc.details()}"


def to_json(status: NodeStatus) -> dict[str, Any]:
    """``{"node": kind, ...every field, defaults included}`` for ``--json``."""
    fields = MessageToDict(status.message, preserving_proto_field_name=True,
                           always_print_fields_with_no_presence=True)
    return {"node": status.kind, **fields}


def render(address: str, status: NodeStatus) -> str:
    """The status as aligned lines for people."""
    if status.kind == "cloud":
        assert isinstance(status.message, verifier_pb2.VerifierStats)
        return _render_cloud(address, status.message)
    assert isinstance(status.message, edge_pb2.EdgeStatus)
    return _render_edge(address, status.message)


def _lines(head: str, rows: list[tuple[str, str]]) -> str:
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join([head, *(f"  {k.ljust(width)}  {v}" for k, v in rows)])


def _render_cloud(address: str, m: verifier_pb2.VerifierStats) -> str:
    s = convert_verifier.verifier_stats_from_pb(m)
    head = f"cloud verifier {address}: {s.state}" + (f" ({s.model_id})" if s.model_id else "")
    if s.state.startswith("warming up"):
        return _lines(head, [("uptime", f"{s.uptime_s:.1f} s")])
    rows = [
        ("sessions", f"{s.live_sessions} of {s.max_sessions}"),
        *([("capacity", s.session_capacity)] if s.session_capacity else []),
        ("KV slots", f"{s.kv_slots_used} of {s.kv_slots_total} in use"),
        ("KV positions", f"{s.kv_positions_used:,} of {s.kv_positions_total:,} in use "
                         f"({s.kv_layout})"),
        ("prefills waiting", str(s.prefills_waiting)),
        ("requests served", str(s.requests_served)),
        ("acceptance (EWMA)", f"{s.acceptance_ewma:.3f}"),
        ("engine steps", f"{s.engine_steps} (mean {s.mean_batch_size:.2f} sessions, "
                         f"{s.mean_tokens_per_step:.2f} tokens per step)"),
        *((f"  {k.kind} steps", _kind(k)) for k in s.step_kinds),
        ("sessions expired", str(s.sessions_expired)),
        ("prefill", s.prefill + (f" ({s.prefill_chunks} pieces written)"
                                 if s.prefill.startswith("chunks") else "")),
        ("prefix cache", _prefix_cache(s)),
        ("batch-invariant", "yes" if s.batch_invariant else "no"),
        ("uptime", f"{s.uptime_s:.1f} s"),
    ]
    rows += [(f"sessions of {p}", str(n)) for p, n in s.sessions_by_principal.items()]
    return _lines(head, rows)


def _kind(k: StepKindTimes) -> str:
    """One kind of step: how many, their device time and the gaps they ended (ms)."""
    device = (f"device p50/p99 {k.device_ms_p50:.1f}/{k.device_ms_p99:.1f} ms"
              if k.device_ms_p50 else "device not timed")
    gaps = (f"gaps p50/p99 {k.gap_ms_p50:.1f}/{k.gap_ms_p99:.1f} ms ({k.gaps_in_tail} in the "
            "ITL p99 tail)" if k.gap_ms_p50 else "no session gaps")
    return f"{k.steps}: {device}, {gaps}"


def _prefix_cache(s: VerifierStats) -> str:
    if not s.prefix_cache_budget_bytes:
        return "off"
    mib = 2**20
    return (f"{s.prefix_cache_entries} clips, {s.prefix_cache_bytes / mib:.1f} of "
            f"{s.prefix_cache_budget_bytes / mib:.1f} MiB; {s.prefix_cache_hits} hits, "
            f"{s.prefix_cache_misses} misses")


def _render_edge(address: str, m: edge_pb2.EdgeStatus) -> str:
    state = "SERVING" if m.serving else f"NOT_SERVING: {m.not_serving_reason}"
    head = f"edge agent {address}: {state}"
    if not m.source:  # still warming up: only the readiness is known
        return _lines(head, [("uptime", f"{m.uptime_s:.1f} s")])
    rows = [
        ("source", m.source + (f" ({m.source_format})" if m.source_format else "")),
        ("draft model", m.draft_model_id + (f", adapter {m.adapter_id}" if m.adapter_id
                                            else "")),
        ("drafter", m.draft_engine or "?"),
        ("vision", m.vision_backend or "torch"),
        ("requests served", str(m.requests_served)),
        ("asks", f"{m.asks_in_flight} in flight, {m.asks_waiting} waiting"
                 + (f" (cloud slots {m.cloud_slots})" if m.cloud_slots else "")),
        ("acceptance (EWMA)", f"{m.acceptance_ewma:.3f}"),
    ]
    if m.link.cloud_address:
        link = m.link
        rows.append(("cloud", f"{link.cloud_address}: {link.cloud_state or '?'}, RTT "
                              f"{link.rtt_ms:.1f} ms" + (f", {link.cloud_model_id}"
                                                        if link.cloud_model_id else "")))
        if link.last_error:
            rows.append(("cloud error", link.last_error))
    if m.HasField("live"):
        live = m.live
        rows.append(("live stream", f"{'connected' if live.connected else 'disconnected'}, "
                                    f"{live.received} events received, {live.dropped} dropped, "
                                    f"{live.reconnects} reconnects"))
    rows.append(("uptime", f"{m.uptime_s:.1f} s"))
    return _lines(head, rows)
