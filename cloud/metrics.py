"""The verifier's Prometheus metrics: one registry per server, fed by small hooks.

Where each number comes from, so recording never changes what the server does:

- the engine thread calls :meth:`CloudMetrics.on_step` once per batched step (batch
  size, tokens, step time under the step's kind: three histogram observations, nothing
  per token);
- each Generate stream owns a :class:`RequestProbe`; it counts per Commit on the event
  loop (inter-token latency, acceptance per draft position) and, at Done, adds the
  request's final statistics to the counters, so the counters move by exactly what
  the requests' ``Done.stats`` report;
- gauges (running, waiting, KV slots) are read at scrape time from the scheduler and
  the session registry.

Names follow vLLM's where the meaning is the same (README, "Metrics").
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from eventspec.cloud.scheduling.step_kinds import StepKind
from eventspec.shared.contract.errors import ErrorCode, EventSpecError
from eventspec.shared.contract.principal import Principal
from eventspec.shared.contract.types import DraftTail, RequestStats
from eventspec.shared.node.metric_principals import principal_label
from eventspec.shared.node.metrics import (
    COUNT_BUCKETS,
    LATENCY_BUCKETS,
    STEP_BUCKETS,
    BoundedLabels,
    NodeMetrics,
)

#: Draft positions with their own ``accepted_tokens_per_pos`` series; deeper ones are
#: counted under the last (the verify width is capped at 33 tokens by default anyway).
MAX_POSITIONS = 32


def edge_label(principal: Principal, principals: str = "name") -> str:
    """The per-edge label: the authenticated principal as ``--metrics-principals`` shows
    it (its name, a digest of it, or ``redacted``), or ``anonymous``
    (``eventspec.shared.node.metric_principals``)."""
    return principal_label(principal, principals)


class CloudMetrics(NodeMetrics):
    """Every verifier metric, registered in ``registry`` (a fresh one by default);
    ``principals`` is ``--metrics-principals``: how the per-edge series name callers."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 principals: str = "name") -> None:
        super().__init__(registry)
        self.principals = principals
        self.edges = BoundedLabels()
        self.request_success = self.counter(
            "request_success", "Generate requests that ended with Done, by mode and "
            "finish reason", ["mode", "finished_reason"])
        self.request_failure = self.counter(
            "request_failure", "Generate requests that ended with an error status, by "
            "mode and status code", ["mode", "code"])
        self.sessions_rejected = self.counter(
            "sessions_rejected", "Generate requests refused before they held a KV slot, "
            "by reason", ["reason"])
        self.auth_failures = self.counter(
            "auth_failures", "Calls refused by authentication or authorisation, by status",
            ["code"])
        self.num_drafts = self.counter(
            "spec_decode_num_drafts", "Target steps that verified at least one draft")
        self.num_draft_tokens = self.counter(
            "spec_decode_num_draft_tokens", "Draft tokens verified (Done.stats.drafted)")
        self.num_accepted_tokens = self.counter(
            "spec_decode_num_accepted_tokens", "Draft tokens accepted "
            "(Done.stats.accepted)")
        self.accepted_per_pos = self.counter(
            "spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted at each "
            "position of a verify step (0 = the first draft after the committed token)",
            ["position"])
        self.drafts_received = self.counter(
            "drafts_received", "Drafts messages (draft tails) received from edges")
        self.draft_tokens_received = self.counter(
            "draft_tokens_received",
            "Token ids in the Drafts messages received (a chain's tokens, a tree's nodes)")
        self.stale_drafts = self.counter(
            "stale_drafts", "Drafts messages dropped because their overlap disagreed "
            "with the committed answer (Done.stats.stale_drafts)")
        self.prefix_cache = self.counter(
            "prefix_cache_requests", "Requests looked up in the prefix cache, by "
            "verdict (Done.stats.prefix_cache: hit or miss)", ["verdict"])
        self.prefix_reused_tokens = self.counter(
            "prefix_reused_tokens", "Prompt positions copied from the prefix cache "
            "instead of prefilled (Done.stats.prefix_reused_tokens)")
        self.hidden_drafts = self.counter(
            "hidden_draft_tokens", "Drafts that reached the cloud before its prefill "
            "ended (Done.stats.hidden_drafted)")
        self.hidden_accepted = self.counter(
            "hidden_accepted_tokens", "Of the hidden drafts, accepted "
            "(Done.stats.hidden_accepted)")
        self.target_steps = self.counter(
            "target_steps", "Per-request target steps, prefill's first token included "
            "(Done.stats.target_steps)")
        self.generation_tokens = self.counter(
            "generation_tokens", "Committed answer tokens (Done.stats.new_tokens)")
        self.prompt_tokens = self.counter(
            "prompt_tokens", "Prompt tokens prefilled (visual placeholders included)")
        self.batch_size = self.histogram(
            "iteration_batch_size", "Sessions in one batched engine step",
            buckets=COUNT_BUCKETS)
        self.step_tokens = self.histogram(
            "iteration_tokens", "Tokens fed to one batched engine step (committed "
            "tokens plus drafts, over all sessions)", buckets=COUNT_BUCKETS)
        self.step_seconds = self.histogram(
            "engine_step_seconds", "One batched engine step: forward plus sampler, by the "
            "step's kind (plain, piece, tower, multi, finishing, eager, after_prefill, "
            "fallback)", ("kind",), buckets=STEP_BUCKETS)
        #: One child per kind, made now: the label set is fixed, and no step looks one up.
        self._step_by_kind = {k: self.step_seconds.labels(str(k)) for k in StepKind}
        self.queue_seconds = self.histogram(
            "request_queue_time_seconds", "From a request's prefill being queued to "
            "its prefill starting", buckets=LATENCY_BUCKETS)
        self.prefill_seconds = self.histogram(
            "request_prefill_time_seconds", "A request's prefill call, first-token "
            "sampling included", buckets=LATENCY_BUCKETS)
        self.ttft_seconds = self.histogram(
            "time_to_first_token_seconds", "From Open to the first committed token, "
            "on the cloud (Done.stats.ttft_ms)", buckets=LATENCY_BUCKETS)
        self.itl_seconds = self.histogram(
            "inter_token_latency_seconds", "Per Commit after the first: time since the "
            "previous Commit divided by the tokens it carries", buckets=STEP_BUCKETS)
        self.e2e_seconds = self.histogram(
            "e2e_request_latency_seconds", "From Open to Done, on the cloud",
            buckets=LATENCY_BUCKETS)
        self.edge_requests = self.counter(
            "requests_by_edge", "Generate requests that ended with Done, per edge "
            "(authenticated principal, as --metrics-principals shows it; at most "
            f"{self.edges.limit} names, then 'other')",
            ["edge"])
        self.edge_request_seconds = self.counter(
            "request_seconds_by_edge", "Seconds from Open to Done summed per edge (divide "
            "by requests_by_edge_total for the mean)", ["edge"])
        self.edge_draft_tokens = self.counter(
            "draft_tokens_by_edge", "Draft tokens verified, per edge", ["edge"])
        self.edge_accepted_tokens = self.counter(
            "accepted_tokens_by_edge", "Draft tokens accepted, per edge", ["edge"])
        self.running = self.gauge(
            "num_requests_running", "Generate streams registered now")
        self.waiting = self.gauge(
            "num_requests_waiting", "Prefills queued for the engine loop now")
        self.kv_used = self.gauge(
            "kv_slots_used", "KV slots held by requests now")
        self.kv_total = self.gauge(
            "kv_slots_total", "KV slots the engine reserved at start-up")
        self.kv_positions_used = self.gauge(
            "kv_positions_used", "KV positions held by requests now (with KV by "
            "length a request holds its prompt plus its answer cap; in slots, whole slots)")
        self.kv_positions_total = self.gauge(
            "kv_positions_total", "KV positions the engine reserved at start-up")
        self.kv_usage = self.gauge(
            "kv_cache_usage_perc", "Fraction of KV positions in use (0..1)")

    def bind(self, *, running: Callable[[], int], waiting: Callable[[], int],
             kv_used: Callable[[], int], kv_total: int, positions_used: Callable[[], int],
             positions_total: int) -> None:
        """Read the gauges from the live server at scrape time (no per-request work).
        ``kv_used`` / ``kv_total``: requests holding KV and the most at once (slots);
        ``positions_*``: the KV memory behind them, in positions."""
        self.running.set_function(running)
        self.waiting.set_function(waiting)
        self.kv_used.set_function(kv_used)
        self.kv_total.set(kv_total)
        self.kv_positions_used.set_function(positions_used)
        self.kv_positions_total.set(positions_total)
        self.kv_usage.set_function(
            lambda: positions_used() / positions_total if positions_total else 0.0)

    # -- the engine thread ---------------------------------------------------------------

    def on_step(self, sessions: int, tokens: int, seconds: float, kind: StepKind) -> None:
        """One batched step of ``kind`` ran (called by the engine loop, once per step)."""
        self.batch_size.observe(sessions)
        self.step_tokens.observe(tokens)
        self._step_by_kind[kind].observe(seconds)

    # -- the streams ---------------------------------------------------------------------

    def request(self, principal: Principal) -> RequestProbe:
        """A probe for one Generate stream."""
        return RequestProbe(self, self.edges(edge_label(principal, self.principals)))


class RequestProbe:
    """What one Generate stream reports; every method is cheap and never raises."""

    def __init__(self, metrics: CloudMetrics, edge: str) -> None:
        self.m = metrics
        self.edge = edge
        self.mode = "unknown"
        #: Where the stream is: "open", "sessions" (registering), "kv" (taking a slot),
        #: "run"; a refusal's reason follows from it.
        self.stage = "open"
        self.per_pos = [0] * MAX_POSITIONS
        self.num_drafts = 0
        self._last_commit: float | None = None
        self._done = False

    def on_drafts(self, tail: DraftTail) -> None:
        """A Drafts message arrived (well-formed)."""
        self.m.drafts_received.inc()
        self.m.draft_tokens_received.inc(len(tail.token_ids) + len(tail.nodes))

    def on_commit(self, tokens: int, verified: int, accepted: int) -> None:
        """A Commit is about to go out: inter-token latency and acceptance by position."""
        now = time.perf_counter()
        if self._last_commit is not None and tokens:
            self.m.itl_seconds.observe((now - self._last_commit) / tokens)
        self._last_commit = now
        if verified:
            self.num_drafts += 1
            for pos in range(min(accepted, MAX_POSITIONS)):
                self.per_pos[pos] += 1
            if accepted > MAX_POSITIONS:
                self.per_pos[-1] += accepted - MAX_POSITIONS

    def on_prefill(self, prompt_tokens: int, queue_s: float) -> None:
        """The request's prefill started after ``queue_s`` in the engine loop's queue."""
        self.m.prompt_tokens.inc(prompt_tokens)
        self.m.queue_seconds.observe(max(0.0, queue_s))

    def on_done(self, finish_reason: str, stats: RequestStats) -> None:
        """Done goes out: add this request's final statistics to the counters."""
        m = self.m
        self._done = True
        m.request_success.labels(self.mode, finish_reason.lower()).inc()
        m.num_drafts.inc(self.num_drafts)
        m.num_draft_tokens.inc(stats.drafted)
        m.num_accepted_tokens.inc(stats.accepted)
        for pos, n in enumerate(self.per_pos):
            if n:
                m.accepted_per_pos.labels(str(pos)).inc(n)
        m.stale_drafts.inc(stats.stale_drafts)
        if stats.prefix_cache:
            m.prefix_cache.labels(stats.prefix_cache).inc()
            m.prefix_reused_tokens.inc(stats.prefix_reused_tokens)
        m.hidden_drafts.inc(stats.hidden_drafted)
        m.hidden_accepted.inc(stats.hidden_accepted)
        m.target_steps.inc(stats.target_steps)
        m.generation_tokens.inc(stats.new_tokens)
        if "prefill" in stats.stage_ms:
            m.prefill_seconds.observe(stats.stage_ms["prefill"] / 1e3)
        if stats.new_tokens:
            m.ttft_seconds.observe(stats.ttft_ms / 1e3)
        m.e2e_seconds.observe(stats.total_ms / 1e3)
        m.edge_requests.labels(self.edge).inc()
        m.edge_request_seconds.labels(self.edge).inc(stats.total_ms / 1e3)
        m.edge_draft_tokens.labels(self.edge).inc(stats.drafted)
        m.edge_accepted_tokens.labels(self.edge).inc(stats.accepted)

    def on_error(self, error: EventSpecError, reason: str | None = None) -> None:
        """The stream ended with ``error``; a refusal before the request held a KV slot
        also counts under ``sessions_rejected`` with its reason."""
        if self._done:
            return
        self._done = True
        self.m.request_failure.labels(self.mode, error.code.name).inc()
        if reason is None and self.stage in ("open", "sessions", "kv"):
            reason = _rejection_reason(self.stage, error)
        if reason is not None:
            self.m.sessions_rejected.labels(reason).inc()

    def on_cancelled(self) -> None:
        """The edge went away before Done."""
        if not self._done:
            self._done = True
            self.m.request_failure.labels(self.mode, "CANCELLED").inc()


def _rejection_reason(stage: str, error: EventSpecError) -> str:
    """A bounded reason for a request refused before it held a KV slot."""
    if stage == "kv":
        return "kv_slots" if error.code == ErrorCode.RESOURCE_EXHAUSTED else "engine_unavailable"
    if stage == "sessions":
        return "per_principal_cap" if "principal" in error.message else "max_sessions"
    if error.code == ErrorCode.DEADLINE_EXCEEDED:
        return "no_open"
    if error.code == ErrorCode.RESOURCE_EXHAUSTED:
        return "too_large"
    return "invalid"
