"""The verifier's long-lived state: model, scheduler (and its engine), sessions, cost model.

Built once at start (``build_runtime``) and shared by every request. Planning lives
here because it combines the server's calibrated cost with each request's edge profile
through the one shared timing model.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eventspec.cloud.config import CloudSettings
from eventspec.cloud.engine.base import BatchedEngine
from eventspec.cloud.requests.kv_queue import KvWaitQueue
from eventspec.cloud.requests.session_capacity import SessionCapacity
from eventspec.cloud.requests.sessions import SessionRegistry
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.target import TargetModel
from eventspec.shared.contract.estimators import AcceptanceEstimator
from eventspec.shared.contract.planning import facts_from_open, request_plan
from eventspec.shared.contract.timing import CloudCost, PlanInputs, TimingPlan
from eventspec.shared.contract.timing_model import replan
from eventspec.shared.contract.types import FeatureMode, OpenRequest, RequestStats, ServerInfo

if TYPE_CHECKING:
    from eventspec.cloud.metrics import CloudMetrics

log = logging.getLogger(__name__)


@dataclass
class VerifierRuntime:
    """Everything a Generate stream needs from the server."""

    settings: CloudSettings
    target: TargetModel
    scheduler: Scheduler
    registry: SessionRegistry
    info: ServerInfo
    acceptance: AcceptanceEstimator = field(default_factory=lambda: AcceptanceEstimator(prior=0.5))
    #: Requests waiting for a KV slot (``--kv-queue``); None: refused at once.
    kv_queue: KvWaitQueue | None = None
    requests_served: int = 0
    #: Prometheus metrics (``--metrics-port``); None: nothing is recorded.
    metrics: CloudMetrics | None = None
    #: An OpenTelemetry tracer (``eventspec.shared.node.tracing``); None: tracing is off.
    tracer: Any = None
    #: What ``--max-sessions`` came to against the KV (``eventspec status`` shows it).
    capacity: SessionCapacity | None = None

    def current_info(self, *, joining: int = 1) -> ServerInfo:
        """``info`` with the cost model's load term set to the sessions a request would
        share each step with (those holding a KV slot, plus ``joining``), so the shared
        plan sees a loaded cloud, whose steps are slower, and drafts when that pays."""
        load = max(1, self.scheduler.live + joining)
        cost = dataclasses.replace(self.info.cloud_cost, load_sessions=float(load))
        return dataclasses.replace(self.info, cloud_cost=cost)

    def plan_for(self, open_req: OpenRequest) -> tuple[TimingPlan, PlanInputs | None]:
        """The request's plan from the one function the edge also runs on the same facts,
        and the inputs it came from (None for target-only requests). The load is the
        cloud's now: this request already holds a slot."""
        return request_plan(
            self.current_info(joining=0), open_req.edge_cost, facts_from_open(open_req)
        )

    def observe(self, stats: RequestStats, rejections: int) -> None:
        """Fold a finished request's acceptance into the server-wide estimate."""
        self.requests_served += 1
        if stats.drafted:
            self.acceptance.observe(stats.accepted, stats.drafted, rejections=rejections)

    def replan(
        self, initial: TimingPlan, inputs: PlanInputs | None, stats: RequestStats,
        rejections: int,
    ) -> TimingPlan:
        """The plan re-run with this request's observed acceptance, reported in Done next
        to what happened (the edge's next request starts from its own updated prior)."""
        if inputs is None or not stats.drafted:
            return initial
        observed = AcceptanceEstimator(prior=inputs.alpha)
        observed.observe(stats.accepted, stats.drafted, rejections=rejections)
        return replan(inputs, observed.value, None)


def server_info_for(
    target: TargetModel, cost: CloudCost, settings: CloudSettings, engine: BatchedEngine
) -> ServerInfo:
    """Describe the loaded target, its cost model and its KV capacity for GetServerInfo."""
    geometry = target.geometry
    prompt = target.build_prompt_ids("")
    return ServerInfo(
        model_id=target.model_id,
        vocab_size=target.vocab_size,
        text_vocab_size=target.text_vocab_size,
        vocab_fingerprint=target.vocab_fingerprint,
        eos_token_id=target.eos_token_id,
        geometry=geometry,
        feature_modes=(FeatureMode.FRAMES, FeatureMode.ALIGNED),
        cloud_cost=cost,
        limits=dataclasses.replace(
            settings.limits, max_verify_tokens=settings.max_verify_tokens,
            kv_slots=engine.num_slots, kv_tokens_per_slot=engine.max_seq_len,
            max_sessions_per_principal=settings.per_principal_cap,
        ),
        prompt_overhead_tokens=len(prompt) - geometry.visual_tokens,
    )
