"""Edge and cloud through the delay proxy (``tests/support/delay_proxy.py``) on loopback: a
real round trip, and connections cut at the worst moments.

- With 20 ms of RTT the speculative answer is still the target's, and the edge's RTT
  estimate sees the delay.
- Through a bandwidth-limited uplink, the edge's uplink estimate is the link's rate as
  the cloud received the aligned features, not the speed of its own buffered writes.
- A cut before anything is committed is retried (the whole request runs again) and the
  asker gets the target's answer; a cut after a committed token has reached the asker
  fails the Ask with UNAVAILABLE (a retry could duplicate text), and the edge serves the
  next Ask once the link is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest
import pytest_asyncio

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.paced import PacedEngine
from eventspec.cloud.server import VerifierServer
from eventspec.edge.config import EdgeSettings
from eventspec.edge.events.toy import ToySource
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract.estimators import ThroughputEstimator
from eventspec.shared.contract.types import (
    UPLOAD_STAGE,
    AskSpec,
    CommittedEvent,
    FeatureMode,
    FinalEvent,
    GenerationSettings,
    Mode,
)
from tests.support import cloud_harness as ch
from tests.support.delay_proxy import DelayProxy, LinkShape
from tests.support.edge_harness import slow_cost, toy_target
from tests.support.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

QUESTION = "What is moving?"
#: A cloud slow enough that a cut lands mid-answer: 0.3 s prefill, 60 ms steps.
PACE = (0.3, 0.06)


class Net:
    def __init__(self, cloud: VerifierServer, proxy: DelayProxy, edge: EdgeServer) -> None:
        self.cloud, self.proxy, self.edge = cloud, proxy, edge

    @property
    def edge_address(self) -> str:
        return f"127.0.0.1:{self.edge.port}"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def net() -> AsyncIterator[Net]:
    target = toy_target()
    engine = PacedEngine(HFEngine(target), prefill_ms=PACE[0] * 1e3, step_ms=PACE[1] * 1e3)
    cloud = VerifierServer(ch.settings(max_sessions=4), target=target, engine=engine,
                           cost=slow_cost(*PACE))
    await cloud.start()
    proxy = DelayProxy(("127.0.0.1", cloud.port), delay_ms=10.0)
    await proxy.start()
    settings = replace(EdgeSettings(), cloud=proxy.address, port=0, model="toy",
                       speculation="always", cloud_wait_s=30.0)
    edge = EdgeServer(settings, source=ToySource([3]))
    await edge.start()
    try:
        yield Net(cloud, proxy, edge)
    finally:
        await edge.stop(0)
        await proxy.stop()
        await cloud.stop(0)


def _spec(mode: Mode, feature_mode: FeatureMode = FeatureMode.AUTO) -> AskSpec:
    return AskSpec(QUESTION, mode=mode, generation=GenerationSettings(max_new_tokens=12),
                   t0_us=0, t1_us=1_000_000, feature_mode=feature_mode)


async def _final(address: str, mode: Mode,
                 feature_mode: FeatureMode = FeatureMode.AUTO) -> FinalEvent:
    async with EdgeClient(address, timeout_s=120) as client:
        return await client.ask_final(_spec(mode, feature_mode))


async def test_a_20ms_round_trip_keeps_the_targets_answer(net: Net) -> None:
    spec = await _final(net.edge_address, Mode.SPECULATIVE)
    base = await _final(net.edge_address, Mode.TARGET_ONLY)
    assert spec.token_ids == base.token_ids and spec.token_ids
    agent = net.edge.agent
    assert agent is not None and agent.link is not None
    assert agent.link.rtt.value >= 19.0  # 10 ms each way, at least
    assert net.proxy.stats.bytes_up > 0 and net.proxy.stats.bytes_down > 0


async def test_the_uplink_estimate_is_the_links_rate_not_the_edges_writes(net: Net) -> None:
    agent = net.edge.agent
    assert agent is not None
    rate = 100e3  # bytes/s: the toy's 35 KB of fp16 features take some 350 ms
    net.proxy.set_shape("up", LinkShape(delay_ms=10.0, rate_bytes_per_s=rate))
    agent.uplink = ThroughputEstimator(min_bytes=0)  # the toy payload is below the floor
    try:
        final = await _final(net.edge_address, Mode.TARGET_ONLY, FeatureMode.ALIGNED)
    finally:
        net.proxy.set_shape("up", LinkShape(delay_ms=10.0))
    assert final.feature_mode == FeatureMode.ALIGNED
    upload_ms = final.stats.stage_ms[UPLOAD_STAGE]  # as the cloud received them
    seen = agent.uplink.bytes_per_s
    assert seen > 0
    # The edge's own clock made the link look 7x faster than it was (it timed its
    # buffered writes). The cloud's timing can err high only by reading the header late
    # while the chunks queue behind it: 3x would take 230 ms of such lag.
    assert seen <= 3 * rate, (seen, upload_ms)
    assert final.stats.uplink_bytes > seen * upload_ms / 1e3  # the payload, plus messages


async def test_a_cut_before_any_commit_is_retried_and_answers(net: Net) -> None:
    base = await _final(net.edge_address, Mode.TARGET_ONLY)
    async with EdgeClient(net.edge_address, timeout_s=120) as client:
        task = asyncio.create_task(client.ask_final(_spec(Mode.SPECULATIVE)))
        # The cloud holds the request in its 0.3 s prefill: nothing committed yet.
        await until(lambda: net.cloud.live_sessions == 1, "the request reached the cloud",
                    timeout_s=30)
        assert net.proxy.cut() >= 1
        final = await asyncio.wait_for(task, 60)
    assert final.token_ids == base.token_ids


async def test_a_cut_after_a_commit_fails_the_ask_and_the_edge_serves_the_next(
    net: Net,
) -> None:
    base = await _final(net.edge_address, Mode.TARGET_ONLY)
    got: list[int] = []
    error: AskError | None = None
    cut = 0
    async with EdgeClient(net.edge_address, timeout_s=120) as client:
        try:
            async for event in client.ask(_spec(Mode.SPECULATIVE)):
                if isinstance(event, CommittedEvent):
                    got.extend(event.token_ids)
                    if not cut:
                        cut = net.proxy.cut()
                if isinstance(event, FinalEvent):
                    pytest.fail("the Ask finished although its cloud link was cut mid-answer")
        except AskError as exc:
            error = exc
    assert cut >= 1
    assert error is not None and error.code == grpc.StatusCode.UNAVAILABLE, error
    # The edge was reachable: the asker is told its cloud failed mid-answer.
    assert error.details.startswith(f"the edge agent at {net.edge_address} cannot use its "
                                    "cloud verifier: cloud verifier: the replica serving this "
                                    "request failed after part of the answer was sent"), error
    assert tuple(got) == base.token_ids[: len(got)]  # what reached the asker: the target's
    after = await _final(net.edge_address, Mode.SPECULATIVE)
    assert after.token_ids == base.token_ids
