"""Requests that find every KV slot taken wait in line for one (``--kv-queue``), over real
gRPC: a waiter gets the next free slot and the target's answer; RESOURCE_EXHAUSTED comes
only when the queue is full or the wait runs out, and says which; a waiter that hangs up
leaves the line."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from grpc import aio

from eventspec.cloud.requests.kv_queue import KvWaitQueue
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.pb.eventspec.v1 import verifier_pb2_grpc
from tests.support import cloud_harness as h
from tests.support.waiting import until

pytestmark = pytest.mark.asyncio(loop_scope="module")

SLOTS = 2
KV_GB = h.tiny_kv_gb(SLOTS)
Q = "What is moving?"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VerifierServer]:
    srv = await h.start_verifier(max_sessions=8, kv_cache_gb=KV_GB, input_timeout_s=30.0,
                                 kv_queue=1, kv_wait_s=30.0)
    yield srv
    await srv.stop(0)


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


def _queue(server: VerifierServer) -> KvWaitQueue:
    assert server.runtime is not None and server.runtime.kv_queue is not None
    return server.runtime.kv_queue


async def _hold(ch: aio.Channel) -> aio.StreamStreamCall:
    """A request that holds its slot: Open with aligned features that never come."""
    call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=60)
    await call.write(h.aligned_open_msg(Q))
    assert (await call.read()).HasField("plan")
    return call


async def test_a_waiter_gets_the_next_free_slot_and_the_targets_answer(
    server: VerifierServer, target: TargetModel
) -> None:
    frames = h.make_frames(3)
    queue = _queue(server)
    before = queue.admitted_after_wait
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        held = [await _hold(ch) for _ in range(SLOTS)]
        waiter = asyncio.create_task(
            h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=8)))
        await until(lambda: queue.waiting == 1, "the third request waits in line",
                    timeout_s=10)
        assert not waiter.done()
        held[0].cancel()  # a slot comes back: the waiter takes it
        out = await asyncio.wait_for(waiter, 60)
        held[1].cancel()
    assert out.tokens == h.target_greedy(target, Q, frames, 8)
    assert queue.admitted_after_wait == before + 1
    await h.wait_for_sessions(server, 0)


async def test_a_full_queue_is_refused_saying_so(server: VerifierServer) -> None:
    queue = _queue(server)
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        held = [await _hold(ch) for _ in range(SLOTS)]
        waiter = await _hold_waiting(ch, queue)
        failure = await h.expect_failure(server.port, [h.open_msg(Q, h.make_frames(3))])
        assert failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"all {SLOTS} KV slots are in use" in failure.details
        assert "queue of 1 requests waiting for KV is full (--kv-queue)" in failure.details
        for call in (*held, waiter):
            call.cancel()
    await h.wait_for_sessions(server, 0)


async def _hold_waiting(ch: aio.Channel, queue: KvWaitQueue) -> aio.StreamStreamCall:
    call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=60)
    await call.write(h.open_msg(Q, h.make_frames(3)))
    await until(lambda: queue.waiting == 1, "a request waits in line", timeout_s=10)
    return call


async def test_the_wait_ends_at_the_requests_deadline_saying_so(server: VerifierServer) -> None:
    queue = _queue(server)
    timed_out = queue.timed_out
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        held = [await _hold(ch) for _ in range(SLOTS)]
        failure = await h.expect_failure(
            server.port, [h.open_msg(Q, h.make_frames(3), deadline_ms=300)])
        for call in held:
            call.cancel()
    assert failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "waited 0.3 s in line for KV" in failure.details
    assert queue.timed_out == timed_out + 1 and queue.waiting == 0
    await h.wait_for_sessions(server, 0)


async def test_a_waiter_that_hangs_up_leaves_the_line(server: VerifierServer,
                                                      target: TargetModel) -> None:
    queue = _queue(server)
    frames = h.make_frames(2)
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        held = [await _hold(ch) for _ in range(SLOTS)]
        waiter = await _hold_waiting(ch, queue)
        waiter.cancel()
        await until(lambda: queue.waiting == 0, "the hung-up waiter left the line",
                    timeout_s=10)
        for call in held:
            call.cancel()
    await h.wait_for_sessions(server, 0)
    out = await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=6))
    assert out.tokens == h.target_greedy(target, Q, frames, 6)
