"""The edge agent's Prometheus metrics: one registry per server, fed by small hooks.

- The servicer gives each Ask an :class:`AskProbe`, which sees the events the client
  sees (previews, commits, the Final): requests by mode and finish reason, preview
  lag, the request's statistics (uplink, drafts the cloud verified and accepted, the
  plan's decision) are counted from there, once per event, never per token.
- The agent reports what only it knows once per cloud request
  (:meth:`EdgeMetrics.on_drafting`: drafts made, sent, discarded, rolled back, and the
  draft model's costs).
- Gauges and the live source's counters are read at scrape time.

Names follow vLLM's where the meaning is the same (README, "Metrics").
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from eventspec.shared.contract.errors import EventSpecError
from eventspec.shared.contract.types import AskEvent, CommittedEvent, FinalEvent, Mode, PreviewEvent
from eventspec.shared.node.metrics import (
    LATENCY_BUCKETS,
    STEP_BUCKETS,
    BoundedLabels,
    NodeMetrics,
    metric_name,
)

if TYPE_CHECKING:
    from eventspec.edge.ask.session import EdgeCounters
    from eventspec.edge.drafting.cache import DraftCache

#: Distinct plan reasons kept as label values (the rest: "other").
MAX_REASONS = 16


def mode_label(mode: Mode) -> str:
    """``speculative``, ``target_only`` or ``draft_only``."""
    return mode.name.lower()


def plan_reason(reason: str) -> str:
    """The plan's reason without its numbers: the words before the first colon or
    semicolon (``speculate``, ``no speculation``, ``target-only request``, ``forced by
    --speculation always``), so the label has a handful of values."""
    return re.split(r"[:;]", reason, maxsplit=1)[0].strip() or "none"


class EdgeMetrics(NodeMetrics):
    """Every edge metric, registered in ``registry`` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self.reasons = BoundedLabels(MAX_REASONS)
        self.requests = self.counter(
            "edge_request_success", "Ask requests answered (a Final was sent), by mode "
            "and finish reason", ["mode", "finished_reason"])
        self.failures = self.counter(
            "edge_request_failure", "Ask requests that ended with an error status, by "
            "mode and status code", ["mode", "code"])
        self.ttft = self.histogram(
            "edge_time_to_first_token_seconds", "From the Ask reaching the cloud path "
            "to the first committed token (Final.stats.ttft_ms)", buckets=LATENCY_BUCKETS)
        self.e2e = self.histogram(
            "edge_e2e_request_latency_seconds", "Whole Ask, as the edge measured it "
            "(Final.stats.total_ms)", buckets=LATENCY_BUCKETS)
        self.draft_per_token = self.histogram(
            "edge_draft_time_per_token_seconds", "The draft model's mean time per "
            "drafted token, one observation per request that drafted", buckets=STEP_BUCKETS)
        self.draft_prefill = self.histogram(
            "edge_draft_prefill_seconds", "The draft model's prefill (events + prompt)",
            buckets=LATENCY_BUCKETS)
        self.draft_tokens = self.counter(
            "edge_draft_tokens", "Tokens the draft model drafted")
        self.drafts_sent = self.counter(
            "edge_drafts_sent", "Drafts messages (draft tails) sent to the cloud")
        self.drafts_discarded = self.counter(
            "edge_draft_tokens_discarded", "Drafted tokens thrown away because a Commit "
            "changed their context while they were computed")
        self.drafts_stale = self.counter(
            "edge_drafts_stale", "Drafts messages the cloud dropped as stale "
            "(Final.stats.stale_drafts)")
        self.rollbacks = self.counter(
            "edge_rollbacks", "Commits that cut the edge's draft tail (a rejected draft)")
        self.verified = self.counter(
            "edge_spec_decode_num_draft_tokens", "Draft tokens the cloud verified "
            "(Final.stats.drafted)")
        self.accepted = self.counter(
            "edge_spec_decode_num_accepted_tokens", "Draft tokens the cloud accepted "
            "(Final.stats.accepted)")
        self.hidden = self.counter(
            "edge_hidden_accepted_tokens", "Hidden drafts accepted "
            "(Final.stats.hidden_accepted)")
        self.preview_lag = self.histogram(
            "edge_preview_lag_seconds", "How long a previewed token waited for the "
            "Commit that confirmed it; one observation per such Commit (its longest wait)",
            buckets=LATENCY_BUCKETS)
        self.uplink_bytes = self.counter(
            "edge_uplink_bytes", "Bytes sent to the cloud (Final.stats.uplink_bytes)")
        self.downlink_bytes = self.counter(
            "edge_downlink_bytes", "Bytes received from the cloud "
            "(Final.stats.downlink_bytes)")
        self.uplink_seconds = self.histogram(
            "edge_uplink_seconds", "From Open sent to the visual input written "
            "(Final.stats.stage_ms.edge_upload)", buckets=LATENCY_BUCKETS)
        self.plan_decisions = self.counter(
            "edge_plan_decisions", "The timing plan's decision per cloud request, with "
            "its reason's first words", ["speculate", "reason"])
        self.auth_failures = self.counter(
            "edge_auth_failures", "Calls refused by authentication or authorisation, by "
            "status", ["code"])
        self.rtt = self.gauge(
            "edge_cloud_rtt_seconds", "Smoothed round-trip time to the cloud (GetServerInfo)")
        self.acceptance = self.gauge(
            "edge_acceptance_ewma", "Smoothed acceptance rate the edge plans with")
        self.queued = self.gauge(
            "edge_num_requests_waiting", "Asks waiting for a cloud slot")
        self.in_flight = self.gauge(
            "edge_num_requests_running", "Asks in flight to the cloud")

    def bind(self, *, rtt_ms: Callable[[], float], acceptance: Callable[[], float],
             queued: Callable[[], int], in_flight: Callable[[], int],
             source: object | None = None) -> None:
        """Read the gauges (and the live source's counters) at scrape time."""
        self.rtt.set_function(lambda: rtt_ms() / 1e3)
        self.acceptance.set_function(acceptance)
        self.queued.set_function(queued)
        self.in_flight.set_function(in_flight)
        if source is not None and hasattr(source, "buffer"):
            self.registry.register(_LiveSourceCollector(source))

    def ask(self, mode: Mode) -> AskProbe:
        """A probe for one Ask."""
        return AskProbe(self, mode_label(mode))

    def on_drafting(self, counters: EdgeCounters, drafter: DraftCache) -> None:
        """A cloud request ended: what the edge drafted for it (the agent calls this)."""
        self.draft_tokens.inc(counters.drafted)
        self.drafts_sent.inc(counters.tails_sent)
        self.drafts_discarded.inc(counters.discarded)
        self.rollbacks.inc(counters.rollbacks)
        if drafter.drafted_total:
            self.draft_per_token.observe(drafter.ms_per_token / 1e3)
        if drafter.prefill_ms:
            self.draft_prefill.observe(drafter.prefill_ms / 1e3)


class AskProbe:
    """What one Ask reports, from the events its client is sent."""

    def __init__(self, metrics: EdgeMetrics, mode: str) -> None:
        self.m = metrics
        self.mode = mode
        self._shown: dict[int, tuple[int, float]] = {}  # position -> (token, first shown)
        self._done = False

    def on_event(self, event: AskEvent) -> None:
        if isinstance(event, PreviewEvent):
            now = time.perf_counter()
            for i, tok in enumerate(event.token_ids):
                pos = event.base + i
                seen = self._shown.get(pos)
                if seen is None or seen[0] != tok:
                    self._shown[pos] = (tok, now)
        elif isinstance(event, CommittedEvent):
            self._on_commit(event)
        elif isinstance(event, FinalEvent):
            self._on_final(event)

    def _on_commit(self, event: CommittedEvent) -> None:
        if not self._shown:
            return
        now = time.perf_counter()
        longest = None
        for i, tok in enumerate(event.token_ids):
            seen = self._shown.pop(event.start + i, None)
            if seen is not None and seen[0] == tok:
                longest = max(longest or 0.0, now - seen[1])
        if longest is not None:
            self.m.preview_lag.observe(longest)
        end = event.start + len(event.token_ids)
        for pos in [p for p in self._shown if p < end]:
            del self._shown[pos]

    def _on_final(self, final: FinalEvent) -> None:
        m, s = self.m, final.stats
        self._done = True
        m.requests.labels(self.mode, final.finish_reason.name.lower()).inc()
        if s.new_tokens:
            m.ttft.observe(s.ttft_ms / 1e3)
        m.e2e.observe(s.total_ms / 1e3)
        m.verified.inc(s.drafted)
        m.accepted.inc(s.accepted)
        m.hidden.inc(s.hidden_accepted)
        m.drafts_stale.inc(s.stale_drafts)
        m.uplink_bytes.inc(s.uplink_bytes)
        m.downlink_bytes.inc(s.downlink_bytes)
        if "edge_upload" in s.stage_ms:
            m.uplink_seconds.observe(s.stage_ms["edge_upload"] / 1e3)
        if final.plan is not None:
            m.plan_decisions.labels(str(final.plan.speculate).lower(),
                                    m.reasons(plan_reason(final.plan.reason))).inc()

    def on_error(self, error: EventSpecError | None) -> None:
        """The Ask ended without a Final (``None``: the client went away)."""
        if not self._done:
            self._done = True
            self.m.failures.labels(self.mode,
                                   error.code.name if error is not None else "CANCELLED").inc()


class _LiveSourceCollector(Collector):
    """A live source's ring-buffer counters and health, read at each scrape."""

    def __init__(self, source: object) -> None:
        self.source = source

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self.source.buffer.stats()  # type: ignore[attr-defined]
        yield CounterMetricFamily(metric_name("edge_source_events"), "Events the live source "
                                  "received (rate() of it is the event rate)",
                                  value=stats.received)
        yield CounterMetricFamily(metric_name("edge_source_events_dropped"), "Events the live "
                                  "source's ring buffer dropped (full)", value=stats.dropped)
        yield GaugeMetricFamily(metric_name("edge_source_events_buffered"), "Events in the live "
                                "source's ring buffer now", value=stats.buffered)
        health = getattr(self.source, "health", lambda: None)()
        connected = getattr(health, "connected", not getattr(self.source, "finished", False))
        yield GaugeMetricFamily(metric_name("edge_source_connected"), "1 while the live stream is "
                                "connected", value=1.0 if connected else 0.0)
        yield CounterMetricFamily(metric_name("edge_source_reconnects"), "Reconnections of the "
                                  "live stream", value=max(0, getattr(health, "reconnects", 0)))

    def describe(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        return iter(())
