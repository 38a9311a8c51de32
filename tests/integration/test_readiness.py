"""Ready means ready: both nodes bind at once and say what they are doing; an Ask waits
for a warming cloud with progress instead of failing; the errors tell warming up,
unreachable and not-a-Verifier apart (issue 18: an edge reported SERVING while its cloud
calibrated, and every Ask failed at once with "the cloud verifier is unreachable").

Real servers on port 0, real stubs; waits are bounded conditions, never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eventspec.cloud.server import VerifierServer
from eventspec.edge.config import EdgeSettings, SettingsError, check_cloud_address
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract.types import (
    AskSpec,
    FinalEvent,
    GenerationSettings,
    Mode,
    ProgressEvent,
)
from eventspec.shared.pb.eventspec.v1 import edge_pb2, edge_pb2_grpc
from tests.support import cloud_harness as ch
from tests.support.edge_harness import shared_models
from tests.support.ports import refusing_port

TARGET_ONLY = AskSpec(question="What is moving?", mode=Mode.TARGET_ONLY,
                      generation=GenerationSettings(max_new_tokens=4))


async def until(condition: Callable[[], Awaitable[bool]], what: str,
                timeout_s: float = 30.0) -> None:
    """Poll ``condition`` until it holds, at most ``timeout_s`` (CI machines are busy)."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        await asyncio.sleep(0.05)


async def health_of(port: int) -> int:
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        resp = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5)
        return int(resp.status)


async def status_of(port: int) -> edge_pb2.EdgeStatus:
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        status: edge_pb2.EdgeStatus = await edge_pb2_grpc.EdgeAgentStub(channel).GetStatus(
            edge_pb2.GetStatusRequest(), timeout=5)
        return status


@contextlib.asynccontextmanager
async def edge_for(cloud: str | None, **settings: object) -> AsyncIterator[EdgeServer]:
    _, draft = shared_models()
    edge = EdgeServer(replace(EdgeSettings(), cloud=cloud, port=0, **settings),  # type: ignore[arg-type]
                      draft=draft)
    await edge.start()
    try:
        yield edge
    finally:
        await edge.stop(0)


async def test_the_edge_binds_before_it_loads_and_reports_why_it_is_not_serving() -> None:
    """The README's "by hand" snippet: a client that arrives while the edge loads gets
    NOT_SERVING and the reason, not "Connection refused"; an Ask waits for the warm-up."""
    _, draft = shared_models()
    edge = EdgeServer(replace(EdgeSettings(), cloud=None, port=0), draft=draft)
    await edge.start(warm=False)
    try:
        assert await health_of(edge.port) == health_pb2.HealthCheckResponse.NOT_SERVING
        status = await status_of(edge.port)
        assert not status.serving and "warming up" in status.not_serving_reason
        spec = replace(TARGET_ONLY, mode=Mode.DRAFT_ONLY)
        async with EdgeClient(f"127.0.0.1:{edge.port}", timeout_s=60) as client:
            events: list[object] = []

            async def ask() -> None:
                async for event in client.ask(spec):
                    events.append(event)

            asking = asyncio.create_task(ask())

            async def waiting() -> bool:
                return any(isinstance(e, ProgressEvent) for e in events)

            await until(waiting, "a Progress message while the edge warms up")
            assert not asking.done()
            await edge.warm_up()
            await asyncio.wait_for(asking, 60)
        progress = [e for e in events if isinstance(e, ProgressEvent)]
        assert progress[0].stage == "edge_warming_up", progress
        assert isinstance(events[-1], FinalEvent) and events[-1].token_ids
        assert await health_of(edge.port) == health_pb2.HealthCheckResponse.SERVING
        assert (await status_of(edge.port)).serving
    finally:
        await edge.stop(0)


async def test_an_ask_waits_for_a_warming_cloud_with_its_phase_then_answers() -> None:
    """The edge is NOT_SERVING while its cloud calibrates; an Ask sent then streams the
    cloud's phase as progress and is answered once the cloud is warm."""
    target, _ = shared_models()
    cloud = VerifierServer(ch.settings(), target=target, cost=ch.TEST_COST)
    await cloud.start(warm=False)
    cloud._warming("calibrating, round 2 of 3: steps of 4 session(s)")
    try:
        async with edge_for(f"127.0.0.1:{cloud.port}") as edge:
            assert await health_of(edge.port) == health_pb2.HealthCheckResponse.NOT_SERVING
            status = await status_of(edge.port)
            assert "calibrating, round 2 of 3" in status.not_serving_reason, status
            assert status.link.cloud_state.startswith("warming up"), status.link
            events: list[object] = []
            async with EdgeClient(f"127.0.0.1:{edge.port}", timeout_s=120) as client:

                async def ask() -> None:
                    async for event in client.ask(TARGET_ONLY):
                        events.append(event)

                asking = asyncio.create_task(ask())

                async def waiting() -> bool:
                    return any(isinstance(e, ProgressEvent) for e in events)

                await until(waiting, "a Progress message naming the cloud's phase")
                await cloud.warm_up()
                await asyncio.wait_for(asking, 60)
            (progress, *_) = [e for e in events if isinstance(e, ProgressEvent)]
            assert progress.stage == "cloud_warming_up"
            assert progress.message == ("waiting for the cloud verifier: calibrating, round 2 "
                                        "of 3: steps of 4 session(s)")
            assert isinstance(events[-1], FinalEvent) and events[-1].token_ids

            async def serving() -> bool:
                return await health_of(edge.port) == health_pb2.HealthCheckResponse.SERVING

            await until(serving, "the edge's health to follow its cloud to SERVING")
    finally:
        await cloud.stop(0)


async def test_an_ask_to_an_unreachable_cloud_fails_after_the_wait_saying_so() -> None:
    with refusing_port() as port:
        async with edge_for(f"127.0.0.1:{port}", cloud_wait_s=1.0) as edge:
            assert await health_of(edge.port) == health_pb2.HealthCheckResponse.NOT_SERVING
            events: list[object] = []
            async with EdgeClient(f"127.0.0.1:{edge.port}", timeout_s=60) as client:
                with pytest.raises(AskError) as err:
                    async for event in client.ask(TARGET_ONLY):
                        events.append(event)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert "cannot use its cloud verifier: cloud verifier: unreachable" in err.value.details, \
            err.value.details
        assert "after waiting" in err.value.details
        assert [e.stage for e in events if isinstance(e, ProgressEvent)] == ["cloud_unreachable"]


async def test_a_cloud_address_that_is_another_edge_is_refused_at_once_as_not_a_verifier(
) -> None:
    """Pointing --cloud at an edge's port gave "unreachable"; it is a wrong address, and
    waiting cannot fix it."""
    async with edge_for(None) as other, \
            edge_for(f"127.0.0.1:{other.port}", cloud_wait_s=30.0) as edge:
        status = await status_of(edge.port)
        assert status.link.cloud_state == "not an eventspec Verifier", status.link
        started = time.monotonic()
        async with EdgeClient(f"127.0.0.1:{edge.port}", timeout_s=60) as client:
            with pytest.raises(AskError) as err:
                await client.ask_final(TARGET_ONLY)
        assert time.monotonic() - started < 25, "it waited as if the cloud might come"
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "does not serve an eventspec Verifier" in err.value.details


async def test_the_edge_health_follows_its_cloud_down() -> None:
    target, _ = shared_models()
    cloud = VerifierServer(ch.settings(), target=target, cost=ch.TEST_COST)
    await cloud.start()
    stopped = False
    try:
        async with edge_for(f"127.0.0.1:{cloud.port}") as edge:
            assert await health_of(edge.port) == health_pb2.HealthCheckResponse.SERVING
            await cloud.stop(0)
            stopped = True

            async def not_serving() -> bool:
                return await health_of(edge.port) == health_pb2.HealthCheckResponse.NOT_SERVING

            await until(not_serving, "the edge's health to follow its cloud down")
            assert "unreachable" in (await status_of(edge.port)).not_serving_reason
    finally:
        if not stopped:
            await cloud.stop(0)


@pytest.mark.parametrize("address", ["http://127.0.0.1:50061", "https://cloud.example:443/"])
def test_a_url_for_the_cloud_is_told_to_drop_the_scheme(address: str) -> None:
    with pytest.raises(SettingsError, match="drop the scheme"):
        check_cloud_address(address)
