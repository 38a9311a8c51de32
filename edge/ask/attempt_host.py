"""What one cloud attempt needs from the edge agent that starts it: :class:`AttemptHost`.

``eventspec.edge.ask.agent`` builds a :class:`~eventspec.edge.ask.cloud_attempt.CloudAttempt`
per Generate call and hands it itself; the attempt reads the agent's settings, models
and estimators and reports back through them. Naming that as a protocol here, rather
than importing ``EdgeAgent`` for its type, keeps the dependency one way: the agent
imports the attempt, and the attempt depends only on this description of the agent,
which :class:`~eventspec.edge.ask.agent.EdgeAgent` satisfies.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol

from eventspec.edge.cost_meter import EdgeCostMeter
from eventspec.edge.drafting.batcher import DraftBatcher
from eventspec.edge.drafting.cache import DraftBackend
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.drafting.tree import TreeShape
from eventspec.edge.uplink.roles import VerifierLink
from eventspec.edge.worker import ModelWorker
from eventspec.shared.contract.estimators import AcceptanceEstimator, ThroughputEstimator
from eventspec.shared.contract.timing import EdgeCost

if TYPE_CHECKING:  # as in the agent: prometheus_client and the commit log are optional
    from eventspec.edge.learning.commit_recorder import CommitRecorder
    from eventspec.edge.metrics import EdgeMetrics


class AttemptHost(Protocol):
    """The agent as an attempt sees it (its attributes of the same names)."""

    #: The cloud verifier; an attempt is only made when there is one.
    link: VerifierLink | None
    #: What drafts (the HF model or the static runtime over its weights).
    draft_backend: DraftBackend
    #: Prompts, EOS and decoding of the drafts' text.
    draft: DraftModel
    worker: ModelWorker
    drafting: DraftBatcher
    force_speculation: bool
    preview_every: int
    tree_shape: TreeShape | None
    drafts_every: int
    request_timeout_s: float
    first_reply_s: float
    #: Updated from each attempt's commits, costs and upload.
    acceptance: AcceptanceEstimator
    costs: EdgeCostMeter
    uplink: ThroughputEstimator
    metrics: EdgeMetrics | None
    commit_recorder: CommitRecorder | None

    def background(self, work: Awaitable[object]) -> None:
        """Run ``work`` without waiting for it (the commit log's rows)."""
        ...

    def edge_cost(self) -> EdgeCost:
        """The edge's current costs, for the Open's plan inputs."""
        ...
