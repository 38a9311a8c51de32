"""Engine failures over real gRPC: a failing step fails its requests with UNAVAILABLE and
the server keeps serving; a dead engine loop turns health NOT_SERVING and refuses new
requests clearly. Never a hang."""

from __future__ import annotations

import grpc
import pytest
import torch
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.server import VerifierServer
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.node.static.batch import StepBatch
from tests.support import cloud_harness as h

pytestmark = pytest.mark.asyncio
Q = "What is moving?"


class FlakyEngine(HFEngine):
    """Steps fail while ``broken`` is set (as a CUDA error would)."""

    broken = False

    def step(self, batch: StepBatch) -> torch.Tensor:
        if self.broken:
            raise RuntimeError("device-side assert triggered")
        return super().step(batch)


async def _start(engine: HFEngine) -> VerifierServer:
    server = VerifierServer(h.settings(max_sessions=4), target=engine.target, engine=engine,
                            cost=h.TEST_COST)
    await server.start()
    return server


async def test_a_failing_step_fails_its_requests_and_the_server_goes_on() -> None:
    target = build_tiny_random_target(seed=0)
    engine = FlakyEngine(target, num_slots=4)
    server = await _start(engine)
    try:
        engine.broken = True
        failure = await h.expect_failure(server.port, [h.open_msg(Q, h.make_frames(1),
                                                                  max_new_tokens=8)])
        assert failure.code == grpc.StatusCode.UNAVAILABLE
        assert "engine failed during step" in failure.details
        await h.wait_for_sessions(server, 0)
        engine.broken = False
        frames = h.make_frames(2)
        out = await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=8))
        assert out.tokens == h.target_greedy(target, Q, frames, 8)
    finally:
        await server.stop(0)


async def test_a_dead_engine_loop_reports_not_serving_and_refuses_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = build_tiny_random_target(seed=0)
    server = await _start(HFEngine(target, num_slots=4))
    try:
        assert server.runtime is not None
        sched = server.runtime.scheduler

        def bug(*args: object) -> None:
            raise AssertionError("a bug in the loop")

        monkeypatch.setattr(sched.plans, "schedule_step", bug)
        failure = await h.expect_failure(server.port, [h.open_msg(Q, h.make_frames(1))])
        assert failure.code == grpc.StatusCode.UNAVAILABLE
        again = await h.expect_failure(server.port, [h.open_msg(Q, h.make_frames(1))])
        assert again.code == grpc.StatusCode.UNAVAILABLE
        assert "engine loop has stopped" in again.details
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            health = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await server.stop(0)
