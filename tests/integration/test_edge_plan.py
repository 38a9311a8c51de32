"""The edge plans from the cloud's inputs and sends what it measured (issue 8).

Both ends run ``eventspec.shared.contract.planning.request_plan`` on the same facts, so the plan
the edge
drafts by must equal the ``Plan`` the cloud sends back, field for field, on frames and on
aligned features. The uplink the edge reports in ``Open`` is the one it measured on its
earlier uploads (0 only before any), and aligned features go as int8 exactly when the
shared plan says fp16 would not fit that uplink.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from eventspec.cloud.runtime import VerifierRuntime
from eventspec.edge.ask.session import EdgeSession
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.contract.estimators import ThroughputEstimator
from eventspec.shared.contract.timing import PlanInputs, TimingPlan
from eventspec.shared.contract.types import (
    UPLOAD_STAGE,
    AskSpec,
    FeatureMode,
    FinalEvent,
    GenerationSettings,
    Mode,
    OpenRequest,
)
from tests.support import edge_harness as eh


@dataclass
class Seen:
    """What each end planned with, request by request."""

    opens: list[OpenRequest] = field(default_factory=list)  # as the cloud received them
    cloud: list[TimingPlan] = field(default_factory=list)
    edge: list[tuple[TimingPlan, TimingPlan]] = field(default_factory=list)  # (own, cloud's)


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[Seen]:
    record = Seen()
    plan_for, on_plan = VerifierRuntime.plan_for, EdgeSession.on_plan

    def cloud_plan_for(self: VerifierRuntime,
                       open_req: OpenRequest) -> tuple[TimingPlan, PlanInputs | None]:
        out = plan_for(self, open_req)
        record.opens.append(open_req)
        record.cloud.append(out[0])
        return out

    def edge_on_plan(self: EdgeSession, plan: TimingPlan) -> None:
        record.edge.append((self.plan, plan))
        on_plan(self, plan)

    monkeypatch.setattr(VerifierRuntime, "plan_for", cloud_plan_for)
    monkeypatch.setattr(EdgeSession, "on_plan", edge_on_plan)
    yield record


async def ask(address: str, question: str, feature_mode: FeatureMode) -> FinalEvent:
    async with EdgeClient(address, timeout_s=120) as client:
        return await client.ask_final(AskSpec(
            question, mode=Mode.SPECULATIVE, feature_mode=feature_mode,
            generation=GenerationSettings(max_new_tokens=6),
        ))


@pytest.mark.parametrize("feature_mode", [FeatureMode.FRAMES, FeatureMode.ALIGNED],
                         ids=["frames", "aligned"])
async def test_edge_plans_what_the_cloud_plans_with_its_measured_uplink(
    seen: Seen, feature_mode: FeatureMode
) -> None:
    stack = await eh.start_stack(adapter=True)
    try:
        agent = stack.edge.agent
        assert agent is not None
        # The tiny payloads are below the estimator's default floor (their time is mostly
        # latency); without it every upload counts, so the second Open has a measurement.
        agent.uplink = ThroughputEstimator(min_bytes=0)
        first = await ask(stack.edge_address, "What is moving?", feature_mode)
        measured = agent.uplink.bytes_per_s
        second = await ask(stack.edge_address, "Which way does it go?", feature_mode)
    finally:
        await stack.stop()
    assert first.feature_mode == second.feature_mode == feature_mode
    assert len(seen.opens) == len(seen.edge) == 2
    for own, cloud in seen.edge:
        assert own == cloud, "the edge's plan differs from the cloud's on the same request"
    assert [p for p, _ in seen.edge] == seen.cloud
    costs = [o.edge_cost for o in seen.opens]
    assert costs[0] is not None and costs[1] is not None
    assert costs[0].uplink_bytes_per_s == 0  # nothing measured before the first upload
    assert costs[1].uplink_bytes_per_s == measured
    if feature_mode == FeatureMode.ALIGNED:  # the cloud timed the features' arrival
        assert measured > 0 and UPLOAD_STAGE in first.stats.stage_ms
    else:  # frames ride inside the Open: nothing times them, the uplink stays unknown
        assert measured == 0 and UPLOAD_STAGE not in first.stats.stage_ms
    assert second.plan == seen.cloud[1]


@pytest.mark.parametrize(("bytes_per_s", "dtype"), [(1e3, "int8"), (1e9, "float16")])
async def test_aligned_features_go_int8_when_fp16_does_not_fit_the_uplink(
    seen: Seen, bytes_per_s: float, dtype: str
) -> None:
    stack = await eh.start_stack(adapter=True)
    try:
        agent = stack.edge.agent
        assert agent is not None
        agent.uplink = ThroughputEstimator(min_bytes=0)
        agent.uplink.observe(int(bytes_per_s), 1.0)  # one upload measured at that rate
        final = await ask(stack.edge_address, "What is moving?", FeatureMode.ALIGNED)
    finally:
        await stack.stop()
    (opened,) = seen.opens
    assert opened.aligned is not None and opened.aligned.dtype == dtype
    assert opened.edge_cost is not None and opened.edge_cost.uplink_bytes_per_s == bytes_per_s
    assert seen.cloud[0].aligned_fits_uplink == (dtype == "float16")
    assert seen.edge[0][0] == seen.edge[0][1]
    assert final.feature_mode == FeatureMode.ALIGNED and final.token_ids
