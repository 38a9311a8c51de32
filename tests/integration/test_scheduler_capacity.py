"""KV capacity over real gRPC: N slots admit N requests, the next one is refused with
RESOURCE_EXHAUSTED saying what is full (with the wait queue off, ``--kv-queue 0``; the
queue has its own tests in ``test_kv_queue.py``), and every way a request ends gives its
slot back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from grpc import aio

from eventspec.cloud.engine.kv import auto_max_seq_len
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract import convert_verifier
from eventspec.shared.contract.types import DoneEvent, FinishReason, ServerLimits
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from tests.support import cloud_harness as h

pytestmark = pytest.mark.asyncio(loop_scope="module")

SLOTS = 2
#: Positions per slot by default: the tiny prompt (157), 256 question tokens and the
#: 512-token answer cap (not the model's 4,096).
POSITIONS = auto_max_seq_len(len(build_tiny_random_target(seed=0).build_prompt_ids("")),
                             ServerLimits().max_new_tokens, 4096)
KV_GB = h.tiny_kv_gb(SLOTS)
Q = "What is moving?"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VerifierServer]:
    srv = await h.start_verifier(max_sessions=8, kv_cache_gb=KV_GB, input_timeout_s=3.0,
                                 kv_queue=0)
    yield srv
    await srv.stop(0)


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


async def _hold(ch: aio.Channel, timeout: float = 30) -> aio.StreamStreamCall:
    """A request that holds its slot: Open with aligned features that never come."""
    call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=timeout)
    await call.write(h.aligned_open_msg(Q))
    assert (await call.read()).HasField("plan")
    return call


async def test_capacity_is_advertised(server: VerifierServer) -> None:
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        info = convert_verifier.server_info_from_pb(
            await verifier_pb2_grpc.VerifierStub(ch).GetServerInfo(
                verifier_pb2.GetServerInfoRequest(), timeout=5))
    assert info.limits.kv_slots == SLOTS
    assert info.limits.kv_tokens_per_slot == POSITIONS == 157 + 256 + 512
    assert info.cloud_cost.load_sessions == 1.0  # idle: a new request would run alone


async def test_the_slot_after_the_last_is_refused_clearly(server: VerifierServer,
                                                          target: TargetModel) -> None:
    frames = h.make_frames(3)
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        held = [await _hold(ch) for _ in range(SLOTS)]
        assert server.held_slots == SLOTS
        failure = await h.expect_failure(server.port, [h.open_msg(Q, frames)])
        assert failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"all {SLOTS} KV slots are in use" in failure.details
        assert "kv_slots" in failure.details
        for call in held:
            call.cancel()
    await h.wait_for_sessions(server, 0)
    out = await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=8))
    assert out.tokens == h.target_greedy(target, Q, frames, 8)


async def _ends_with_done(server: VerifierServer) -> None:
    out = await h.run_generate(server.port, h.open_msg(Q, h.make_frames(4), max_new_tokens=6))
    assert out.done.finish_reason in (FinishReason.MAX_TOKENS, FinishReason.EOS)


async def _ends_with_cancel(server: VerifierServer) -> None:
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=30)
        await call.write(h.open_msg(Q, h.make_frames(5), max_new_tokens=200))
        await call.write(verifier_pb2.EdgeMessage(cancel=verifier_pb2.Cancel(reason="user")))
        events = [convert_verifier.cloud_message_from_pb(m) for m in await h.drain(call)]
    assert isinstance(events[-1], DoneEvent)


async def _ends_with_cancel_before_features(server: VerifierServer) -> None:
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        call = await _hold(ch)
        await call.write(verifier_pb2.EdgeMessage(cancel=verifier_pb2.Cancel(reason="user")))
        done = convert_verifier.cloud_message_from_pb((await h.drain(call))[-1])
    assert isinstance(done, DoneEvent) and done.finish_reason == FinishReason.CANCELLED


async def _ends_with_disconnect(server: VerifierServer) -> None:
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=30)
        await call.write(h.open_msg(Q, h.make_frames(6), max_new_tokens=200))
        await call.read()
        assert server.held_slots == 1
        call.cancel()


async def _ends_with_open_deadline(server: VerifierServer) -> None:
    out = await h.run_generate(server.port, h.open_msg(Q, h.make_frames(7), max_new_tokens=500,
                                                       deadline_ms=1))
    assert out.done.finish_reason == FinishReason.DEADLINE


async def _ends_with_grpc_deadline(server: VerifierServer) -> None:
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        call = await _hold(ch, timeout=0.3)
        with pytest.raises(grpc.RpcError):
            await h.drain(call)


async def _ends_with_bad_drafts(server: VerifierServer) -> None:
    failure = await h.expect_failure(
        server.port, [h.open_msg(Q, h.make_frames(8), max_new_tokens=200),
                      h.drafts_msg(0, [10**6])])
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT


async def _ends_with_features_timeout(server: VerifierServer) -> None:
    failure = await h.expect_failure(server.port, [h.aligned_open_msg(Q)])
    assert failure.code == grpc.StatusCode.DEADLINE_EXCEEDED


ENDINGS = {
    "done": _ends_with_done, "cancel": _ends_with_cancel,
    "cancel_before_features": _ends_with_cancel_before_features,
    "disconnect": _ends_with_disconnect, "open_deadline": _ends_with_open_deadline,
    "grpc_deadline": _ends_with_grpc_deadline, "bad_drafts": _ends_with_bad_drafts,
    "features_timeout": _ends_with_features_timeout,
}


@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_every_ending_gives_the_slot_back(server: VerifierServer, ending: str) -> None:
    await h.wait_for_sessions(server, 0)
    # Twice as many requests as slots, one after another: a lost slot would refuse one.
    for _ in range(2 * SLOTS):
        await ENDINGS[ending](server)
        await h.wait_for_sessions(server, 0)
    assert server.runtime is not None
    assert server.runtime.scheduler.pool.free == SLOTS


async def test_ttl_sweep_gives_the_slot_back() -> None:
    srv = await h.start_verifier(max_sessions=4, kv_cache_gb=KV_GB, session_ttl_s=0.3,
                                 input_timeout_s=30.0)
    try:
        for _ in range(SLOTS + 1):
            failure = await h.expect_failure(srv.port, [h.aligned_open_msg(Q)], timeout=20)
            assert failure.code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "TTL" in failure.details
            await h.wait_for_sessions(srv, 0)
    finally:
        await srv.stop(0)


async def test_concurrent_requests_share_steps(server: VerifierServer,
                                               target: TargetModel) -> None:
    frames = [h.make_frames(20 + i) for i in range(SLOTS)]
    outs = await asyncio.gather(*(h.run_generate(
        server.port, h.open_msg(Q, f, max_new_tokens=12, speculative=False)) for f in frames))
    for f, out in zip(frames, outs, strict=True):
        assert out.tokens == h.target_greedy(target, Q, f, 12)
    assert server.runtime is not None
    assert max(server.runtime.scheduler.stats.batch_sizes) == SLOTS
