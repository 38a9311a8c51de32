"""KV by length through the real server (static engine, CPU): in a budget that holds
two default slots, requests that need only their prompt and a short answer run many at
once; the next waits in the KV queue and gets the target's answer when one ends."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from grpc import aio

from eventspec.cloud.server import VerifierServer
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.pb.eventspec.v1 import verifier_pb2_grpc
from tests.support import cloud_harness as h
from tests.support.waiting import until

pytestmark = pytest.mark.asyncio

Q = "What is moving?"
MAX_NEW = 8


async def _hold(ch: aio.Channel) -> aio.StreamStreamCall:
    """A request that holds its KV: Open with aligned features that never come."""
    call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=60)
    await call.write(h.aligned_open_msg(Q, max_new_tokens=MAX_NEW))
    assert (await call.read()).HasField("plan")
    return call


async def test_short_requests_share_the_memory_of_two_slots_and_the_rest_queue() -> None:
    target = build_tiny_random_target(seed=0)
    settings = replace(h.settings(kv_cache_gb=h.tiny_kv_gb(2), max_sessions=64, kv_queue=4),
                       engine="static")
    server = VerifierServer(settings, target=target, cost=h.TEST_COST)
    await server.start()
    try:
        assert server.runtime is not None and server.runtime.kv_queue is not None
        sched, queue = server.runtime.scheduler, server.runtime.kv_queue
        assert sched.kv_by_length
        arena = sched.engine.kv_positions  # type: ignore[attr-defined]
        need = len(target.build_prompt_ids(Q)) + MAX_NEW
        fits = arena // need
        assert fits >= 4, "the budget of two slots must hold several short requests"
        frames = h.make_frames(3)
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            held = [await _hold(ch) for _ in range(fits)]
            assert server.held_slots == fits
            assert sched.pool.positions_used == fits * need  # each holds what it needs
            waiter = asyncio.create_task(
                h.run_generate(server.port, h.open_msg(Q, frames, max_new_tokens=MAX_NEW)))
            await until(lambda: queue.waiting == 1, "the next request waits for KV",
                        timeout_s=10)
            held[0].cancel()  # a run comes back: the waiter takes it
            out = await asyncio.wait_for(waiter, 60)
            for call in held[1:]:
                call.cancel()
        assert out.tokens == h.target_greedy(target, Q, frames, MAX_NEW)
        await h.wait_for_sessions(server, 0)
        assert sched.pool.positions_free == arena  # type: ignore[union-attr]
    finally:
        await server.stop(0)
    engine = sched.engine
    assert engine.k_cache.numel() == 0 and not engine.step_graphs, (  # type: ignore[attr-defined]
        "a stopped server gives its engine's KV back (a benchmark builds the next one)")
