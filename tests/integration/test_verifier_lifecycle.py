"""Request lifecycle over real gRPC: cancel, disconnect, deadlines, the session cap, the
TTL sweep, input timeouts, and the aligned-features path."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest
import pytest_asyncio
import torch
from grpc import aio

from eventspec.cloud.process import gc_freeze
from eventspec.cloud.requests.sessions import SessionRegistry
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract import convert_verifier
from eventspec.shared.contract.codec import quantize_int8
from eventspec.shared.contract.timing import TimingPlan
from eventspec.shared.contract.types import CommitEvent, DoneEvent, FinishReason
from eventspec.shared.pb.eventspec.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from tests.support import cloud_harness as h

pytestmark = pytest.mark.asyncio(loop_scope="module")

INPUT_TIMEOUT_S = 1.0
# A clip whose greedy answer runs past 300 tokens without EOS: time to act mid-generation.
LONG_Q, LONG_SEED, LONG_MAX = "What is moving?", 1000, 500
Q, SEED, MAX = "Describe the scene.", 1003, 24


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VerifierServer]:
    srv = await h.start_verifier(max_sessions=4, input_timeout_s=INPUT_TIMEOUT_S)
    yield srv
    await srv.stop(0)


def _long_open(**kw: object) -> verifier_pb2.EdgeMessage:
    return h.open_msg(LONG_Q, h.make_frames(LONG_SEED), max_new_tokens=LONG_MAX, **kw)  # type: ignore[arg-type]


async def _read_event(call: aio.StreamStreamCall) -> object:
    msg = await asyncio.wait_for(call.read(), timeout=20)
    assert msg is not aio.EOF, "stream ended early"
    return convert_verifier.cloud_message_from_pb(msg)


async def _read_until_commit(call: aio.StreamStreamCall) -> CommitEvent:
    while True:
        event = await _read_event(call)
        assert not isinstance(event, DoneEvent), f"finished before the test acted: {event}"
        if isinstance(event, CommitEvent):
            return event


# -- cancel and disconnect ----------------------------------------------------------------------


async def test_cancel_message_mid_generation(server: VerifierServer) -> None:
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=30)
        await call.write(_long_open())
        first = await _read_until_commit(call)
        assert server.live_sessions == 1
        await call.write(verifier_pb2.EdgeMessage(cancel=verifier_pb2.Cancel(reason="user")))
        committed = list(first.token_ids)
        while True:
            event = await _read_event(call)
            if isinstance(event, DoneEvent):
                break
            assert isinstance(event, CommitEvent)
            committed.extend(event.token_ids)
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
    assert event.finish_reason == FinishReason.CANCELLED
    assert list(event.token_ids) == committed
    assert 0 < len(committed) < LONG_MAX
    await h.wait_for_sessions(server, 0)


async def test_cancel_before_features_arrive(server: VerifierServer) -> None:
    """Cancel while the cloud waits for aligned features: Done(CANCELLED) at once."""
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=30)
        await call.write(h.aligned_open_msg(Q))
        assert isinstance(await _read_event(call), TimingPlan)
        t0 = time.perf_counter()
        await call.write(verifier_pb2.EdgeMessage(cancel=verifier_pb2.Cancel(reason="user")))
        event = await _read_event(call)
        elapsed = time.perf_counter() - t0
    assert isinstance(event, DoneEvent), event
    assert event.finish_reason == FinishReason.CANCELLED
    assert event.token_ids == ()
    assert elapsed < INPUT_TIMEOUT_S, "cancel waited for the input timeout"
    await h.wait_for_sessions(server, 0)


async def test_client_disconnect_mid_stream_frees_the_session(server: VerifierServer,
                                                               target: TargetModel) -> None:
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=30)
        await call.write(_long_open())
        await _read_until_commit(call)
        assert server.live_sessions == 1
        assert call.cancel()
    await h.wait_for_sessions(server, 0)
    # The server keeps serving.
    frames = h.make_frames(SEED)
    out = await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=MAX))
    assert out.tokens == h.target_greedy(target, Q, frames, MAX)


@pytest.mark.parametrize("where", ["waiting_for_features", "generating"])
async def test_grpc_deadline_mid_stream(server: VerifierServer, where: str) -> None:
    first = h.aligned_open_msg(Q) if where == "waiting_for_features" else _long_open()
    received: list[object] = []
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=0.4)
        await call.write(first)
        with pytest.raises(grpc.RpcError) as err:
            while True:
                msg = await asyncio.wait_for(call.read(), timeout=10)
                assert msg is not aio.EOF
                received.append(convert_verifier.cloud_message_from_pb(msg))
                assert not isinstance(received[-1], DoneEvent), "finished inside the deadline"
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert received, "the Plan should have arrived before the deadline"
    await h.wait_for_sessions(server, 0)


# -- request deadlines and input timeouts -------------------------------------------------------


async def test_open_deadline_ms_ends_with_done_deadline(server: VerifierServer) -> None:
    out = await h.run_generate(server.port, _long_open(deadline_ms=150))
    assert out.done.finish_reason == FinishReason.DEADLINE
    assert len(out.tokens) < LONG_MAX
    assert out.done.stats.total_ms >= 150
    await h.wait_for_sessions(server, 0)


async def test_open_deadline_ms_while_waiting_for_features(server: VerifierServer) -> None:
    t0 = time.perf_counter()
    failure = await h.expect_failure(server.port, [h.aligned_open_msg(Q, deadline_ms=200)])
    assert time.perf_counter() - t0 >= 0.2 * 0.9
    assert failure.code == grpc.StatusCode.DEADLINE_EXCEEDED
    # The request's deadline ended it (0.2 s), not the input timeout: the details say which.
    assert "did not arrive within 0.2 s" in failure.details, failure.details
    await h.wait_for_sessions(server, 0)


async def test_features_that_never_arrive_time_out(server: VerifierServer) -> None:
    t0 = time.perf_counter()
    failure = await h.expect_failure(server.port, [h.aligned_open_msg(Q)], timeout=20)
    elapsed = time.perf_counter() - t0
    assert failure.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"did not arrive within {INPUT_TIMEOUT_S:.1f} s" in failure.details
    assert elapsed >= INPUT_TIMEOUT_S * 0.9, elapsed  # the details name the bound that fired
    await h.wait_for_sessions(server, 0)


async def test_features_cut_off_mid_tensor_time_out(server: VerifierServer,
                                                    target: TargetModel) -> None:
    feats = h.features_for(target, h.make_frames(SEED))
    partial = h.tensor_msgs(feats)[:-1]  # header and all but the last chunk, stream left open
    failure = await h.expect_failure(server.port, [h.aligned_open_msg(Q), *partial], timeout=20)
    assert failure.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "did not arrive" in failure.details
    await h.wait_for_sessions(server, 0)


# -- the session cap and the TTL sweep ----------------------------------------------------------


async def test_session_cap(target: TargetModel) -> None:
    srv = await h.start_verifier(max_sessions=1)
    try:
        frames = h.make_frames(SEED)
        reference = h.target_greedy(target, Q, frames, MAX)
        async with aio.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
            call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=30)
            await call.write(h.aligned_open_msg(Q, max_new_tokens=MAX))
            await _read_event(call)  # Plan: the session is registered
            assert srv.live_sessions == 1

            failure = await h.expect_failure(srv.port, [h.open_msg(Q, frames)])
            assert failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "cap of 1 concurrent sessions" in failure.details

            for m in h.tensor_msgs(h.features_for(target, frames)):
                await call.write(m)
            committed: list[int] = []
            while True:
                event = await _read_event(call)
                if isinstance(event, DoneEvent):
                    break
                assert isinstance(event, CommitEvent)
                committed.extend(event.token_ids)
            await call.done_writing()
        assert committed == reference
        await h.wait_for_sessions(srv, 0)
        # Below the cap again: a new request is served.
        out = await h.run_generate(srv.port, h.open_msg(Q, frames, max_new_tokens=MAX))
        assert out.tokens == reference
    finally:
        await srv.stop(0)


async def test_registry_sweep_releases_and_cancels_expired_sessions() -> None:
    now = [100.0]
    registry = SessionRegistry(max_sessions=3, ttl_s=10.0, clock=lambda: now[0])
    released: list[str] = []
    opened = asyncio.Event()

    def release_of(name: str):  # type: ignore[no-untyped-def]
        async def release() -> None:
            released.append(name)

        return release

    async def session(name: str) -> None:
        key = registry.open(name, release_of(name))
        try:
            opened.set()
            await asyncio.sleep(3600)
        finally:
            await registry.close(key)

    old = asyncio.create_task(session("old"))
    await opened.wait()
    opened.clear()
    now[0] = 105.0
    young = asyncio.create_task(session("young"))
    await opened.wait()
    assert len(registry) == 2

    now[0] = 110.0  # "old" is exactly at its TTL: not yet expired
    assert await registry.sweep() == 0
    now[0] = 112.0
    assert await registry.sweep() == 1
    assert released == ["old"] and len(registry) == 1 and registry.expired == 1
    with pytest.raises(asyncio.CancelledError):
        await old
    assert released == ["old"], "the cancelled task's own close must not release twice"
    assert not young.done()

    now[0] = 200.0
    assert await registry.sweep() == 1
    with pytest.raises(asyncio.CancelledError):
        await young
    assert released == ["old", "young"] and len(registry) == 0


async def test_ttl_sweeper_ends_a_stuck_stream() -> None:
    srv = await h.start_verifier(max_sessions=2, session_ttl_s=0.4, input_timeout_s=30.0)
    try:
        t0 = time.perf_counter()
        failure = await h.expect_failure(srv.port, [h.aligned_open_msg(Q)], timeout=20)
        assert time.perf_counter() - t0 < 5, "the client waited for its own deadline"
        assert failure.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "exceeded the verifier's TTL of 0.4 s" in failure.details
        await h.wait_for_sessions(srv, 0)
        assert srv.runtime is not None and srv.runtime.registry.expired == 1
    finally:
        await srv.stop(0)


# -- the aligned-features happy path ------------------------------------------------------------


async def test_server_info_geometry_matches_feature_tensor(server: VerifierServer,
                                                           target: TargetModel) -> None:
    async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        info = await verifier_pb2_grpc.VerifierStub(ch).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=10
        )
    feats = h.features_for(target, h.make_frames(SEED))
    g = info.geometry
    assert tuple(feats.shape) == (g.num_frames, g.tokens_per_frame, g.feature_dim)
    assert g.image_size == target.geometry.image_size
    assert common_pb2.FEATURE_MODE_ALIGNED in info.feature_modes
    assert feats.numel() * 4 <= info.limits.max_tensor_bytes


@pytest.mark.parametrize("seed", [SEED, 1004, 1007])
async def test_aligned_fp32_equals_frames(server: VerifierServer, target: TargetModel,
                                          seed: int) -> None:
    frames = h.make_frames(seed)
    reference = h.target_greedy(target, Q, frames, MAX)
    by_frames = await h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=MAX))
    feats = h.features_for(target, frames)
    by_features = await h.run_generate(
        server.port, h.aligned_open_msg(Q, max_new_tokens=MAX), extra=h.tensor_msgs(feats)
    )
    assert by_frames.tokens == reference
    assert by_features.tokens == reference, "fp32 aligned features differ from the frames path"
    # Speculative over aligned features, with perfect drafts, is still identical.
    spec = await h.run_generate(
        server.port, h.aligned_open_msg(Q, max_new_tokens=MAX, speculative=True),
        extra=h.tensor_msgs(feats), policy=h.perfect(reference),
    )
    assert spec.tokens == reference
    await h.wait_for_sessions(server, 0)


@pytest.mark.parametrize("dtype", ["int8", "float16", "bfloat16"])
async def test_aligned_compressed_features_complete(server: VerifierServer, target: TargetModel,
                                                    dtype: str) -> None:
    feats = h.features_for(target, h.make_frames(SEED))
    if dtype == "int8":
        q, scale = quantize_int8(feats.numpy())
        assert float(abs(q.astype("float32") * scale - feats.numpy()).max()) <= scale / 2 + 1e-6
        msgs = h.tensor_msgs(q, scale=scale)
    else:
        msgs = h.tensor_msgs(feats.to(getattr(torch, dtype)))
    out = await h.run_generate(server.port, h.aligned_open_msg(Q, dtype=dtype,
                                                               max_new_tokens=MAX), extra=msgs)
    assert out.done.finish_reason in (FinishReason.EOS, FinishReason.MAX_TOKENS)
    assert 0 < len(out.tokens) <= MAX
    assert out.done.stats.uplink_bytes >= sum(len(m.tensor_chunk.data) for m in msgs)
    await h.wait_for_sessions(server, 0)


async def test_registry_sweep_prefers_the_expire_callback() -> None:
    now = [0.0]
    registry = SessionRegistry(max_sessions=1, ttl_s=1.0, clock=lambda: now[0])
    expired: list[str] = []
    released: list[int] = []

    async def release() -> None:
        released.append(1)

    async def session() -> None:
        registry.open("r", release, expired.append)
        await asyncio.sleep(3600)

    task = asyncio.create_task(session())
    await asyncio.sleep(0)
    now[0] = 5.0
    assert await registry.sweep() == 1
    assert expired == ["session exceeded the verifier's TTL of 1 s"]
    assert released == [1] and len(registry) == 0
    assert not task.done(), "with an expire callback the stream ends itself"
    task.cancel()


async def test_the_switch_interval_is_short_while_serving_and_restored_after() -> None:
    """--gil-switch-interval-ms holds while an engine loop runs (the engine thread gets
    the GIL back from the event loop within it), and the interpreter's own comes back
    when the last of two servers stops, whichever stops first."""
    before = sys.getswitchinterval()
    first = await h.start_verifier()
    second = await h.start_verifier()
    try:
        assert first.settings.gil_switch_interval_ms == 0.1
        assert sys.getswitchinterval() == pytest.approx(1e-4, abs=2e-6)
        await first.stop(0)  # not the last one started: the interval stays short
        assert sys.getswitchinterval() == pytest.approx(1e-4, abs=2e-6)
    finally:
        await first.stop(0)
        await second.stop(0)
    assert sys.getswitchinterval() == before


async def test_a_warm_server_freezes_the_collectors_heap_and_the_last_to_stop_thaws_it() -> None:
    """--gc-freeze (on by default): once warm, the model and the engine sit in the
    collector's permanent generation (full passes skip them); when the last of two
    servers stops, whichever stops first, the process's objects are collectable again.
    A server with --gc-freeze off leaves the collector alone."""
    base = gc_freeze.holders()  # servers of other tests may still be up (module fixtures)
    first = await h.start_verifier()
    second = await h.start_verifier()
    try:
        assert gc_freeze.holders() == base + 2 and gc.get_freeze_count() > 0
        await first.stop(0)
        assert gc_freeze.holders() == base + 1 and gc.get_freeze_count() > 0
    finally:
        await first.stop(0)  # a second stop lets go of nothing
        await second.stop(0)
    assert gc_freeze.holders() == base
    if base == 0:
        assert gc.get_freeze_count() == 0
    off = VerifierServer(replace(h.settings(), gc_freeze=False),
                         target=build_tiny_random_target(seed=0), cost=h.TEST_COST)
    await off.start()
    try:
        assert gc_freeze.holders() == base
    finally:
        await off.stop(0)
    if base == 0:
        with pytest.raises(RuntimeError, match="more often than held"):
            gc_freeze.let_go()
