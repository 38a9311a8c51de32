"""Client -> edge -> cloud over real gRPC: the invariant end to end, hidden drafts,
draft_only without a cloud, and a cloud dying mid-request."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest

from eventspec.edge.config import EdgeSettings
from eventspec.edge.drafting.static_backend import draft_engine_name
from eventspec.edge.events.sources import NpzSource, open_source
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.edge_client import AskError
from eventspec.shared.contract.types import (
    FeatureMode,
    Mode,
)
from tests.support import edge_harness as eh
from tests.support.edge_harness import ask
from tests.support.recordings import write_dsec
from tests.support.waiting import until

QUESTIONS = ["What is moving?", "Which way does it go?", "Describe the scene.",
             "How many objects are there?"]


#: Questions the toy pair was trained on (the toy world's templates).
TOY_QUESTIONS = ["Which way is the object moving?", "How many objects are there?",
                 "What shape is the object?", "Is anything moving?"]


@pytest.mark.parametrize(("seed", "draft_engine"), [(0, "hf"), (1, "hf"), (2, "static")])
async def test_speculative_equals_target_only_on_a_loaded_cloud(
    seed: int, draft_engine: str
) -> None:
    """A slowed cloud makes drafting pay; the toy draft agrees with the toy target, so
    drafts are accepted and the equality is tested on accepted and rejected drafts, with
    the HF drafter and with the static-KV one (``--draft-engine static``)."""
    cloud, edge = await eh.start_toy_stack(seed, slow=(1.0, 0.15),
                                           edge_settings={"draft_engine": draft_engine})
    assert edge.agent is not None
    assert draft_engine_name(edge.agent.draft_backend) == draft_engine
    address = f"127.0.0.1:{edge.port}"
    try:
        for i, question in enumerate(TOY_QUESTIONS[seed % 2::2]):
            spec = await ask(address, question, Mode.SPECULATIVE, max_new=10 + i)
            base = await ask(address, question, Mode.TARGET_ONLY, max_new=10 + i)
            assert spec.token_ids == base.token_ids, (question, spec.plan)
            assert spec.answer == base.answer
            assert base.stats.drafted == 0
            assert spec.plan is not None and spec.plan.speculate, spec.plan
            assert 0 < spec.stats.accepted <= spec.stats.drafted, (question, spec.stats)
    finally:
        await edge.stop(0)
        await cloud.stop(0)


async def test_hidden_drafts_arrive_during_a_slow_prefill() -> None:
    stack = await eh.start_stack(slow=(1.5, 0.15))
    try:
        spec = await ask(stack.edge_address, "What is moving?", Mode.SPECULATIVE, max_new=8)
        assert spec.stats.hidden_drafted > 0, spec.stats
        assert spec.plan is not None and spec.plan.hidden_draft_budget > 0
        base = await ask(stack.edge_address, "What is moving?", Mode.TARGET_ONLY, max_new=8)
        assert spec.token_ids == base.token_ids
    finally:
        await stack.stop()


@pytest.mark.parametrize("seed", [3, 4, 5])
async def test_fast_cloud_speculative_equals_target_only(seed: int) -> None:
    """Fast steps (the real engine's, unpaced) with drafting forced: the output is the
    cloud's, and the toy draft's tokens are accepted. The prefill is paced to 1 s so the
    drafts made during it arrive before an unpaced cloud has finished a 6-token answer."""
    cloud, edge = await eh.start_toy_stack(seed, slow=(1.0, 0.0),
                                           edge_settings={"speculation": "always"})
    address = f"127.0.0.1:{edge.port}"
    try:
        for question in TOY_QUESTIONS[seed % 2 :: 2]:
            a = await ask(address, question, Mode.SPECULATIVE, max_new=20)
            b = await ask(address, question, Mode.TARGET_ONLY, max_new=20)
            assert a.token_ids == b.token_ids
            assert a.window is not None and a.window.num_events > 0
            assert 0 < a.stats.accepted <= a.stats.drafted, (question, a.stats)
    finally:
        await edge.stop(0)
        await cloud.stop(0)


async def test_dsec_source_end_to_end(tmp_path: Path) -> None:
    write_dsec(tmp_path, seed=11)
    stack = await eh.start_stack(source=open_source(f"dsec:{tmp_path}"), slow=(1.0, 0.15))
    try:
        for question in QUESTIONS[:2]:
            a = await ask(stack.edge_address, question, Mode.SPECULATIVE, latest_ms=800)
            b = await ask(stack.edge_address, question, Mode.TARGET_ONLY, latest_ms=800)
            assert a.token_ids == b.token_ids
            assert a.feature_mode == FeatureMode.FRAMES
    finally:
        await stack.stop()


async def test_npz_event_only_source_uses_aligned_features(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 20_000
    path = tmp_path / "events.npz"
    np.savez(path, x=rng.integers(0, 80, n), y=rng.integers(0, 60, n),
             t=np.sort(rng.integers(0, 1_500_000, n)), p=rng.integers(0, 2, n))
    stack = await eh.start_stack(source=NpzSource(path), adapter=True, slow=(1.0, 0.15))
    try:
        a = await ask(stack.edge_address, "What is moving?", Mode.SPECULATIVE)
        b = await ask(stack.edge_address, "What is moving?", Mode.TARGET_ONLY)
        assert a.feature_mode == FeatureMode.ALIGNED
        assert a.token_ids == b.token_ids
        assert a.stats.uplink_bytes > 8 * 17 * 32 * 2  # the fp16 features went up
        with pytest.raises(AskError) as err:
            await ask(stack.edge_address, "What?", Mode.SPECULATIVE,
                      feature_mode=FeatureMode.FRAMES)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "RGB" in err.value.details
    finally:
        await stack.stop()


async def test_draft_only_works_without_a_cloud() -> None:
    _, draft = eh.shared_models()
    edge = EdgeServer(replace(EdgeSettings(), cloud=None, port=0), draft=draft)
    await edge.start()
    try:
        address = f"127.0.0.1:{edge.port}"
        final = await ask(address, "What is moving?", Mode.DRAFT_ONLY, max_new=10)
        assert final.mode == Mode.DRAFT_ONLY
        assert 0 < len(final.token_ids) <= 10
        assert final.stats.target_steps == 0
        with pytest.raises(AskError) as err:
            await ask(address, "What is moving?", Mode.SPECULATIVE)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert "draft_only" in err.value.details
    finally:
        await edge.stop(0)


async def test_unreachable_cloud_is_unavailable_and_edge_keeps_serving() -> None:
    _, draft = eh.shared_models()
    edge = EdgeServer(replace(EdgeSettings(), cloud="127.0.0.1:1", port=0, rpc_timeout_s=1.0,
                              cloud_wait_s=1.0), draft=draft)
    await edge.start()
    try:
        address = f"127.0.0.1:{edge.port}"
        with pytest.raises(AskError) as err:
            await ask(address, "What is moving?", Mode.TARGET_ONLY)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        # The caller learns the cloud is unreachable, not where it lives (issue 11).
        assert "cloud verifier: unreachable" in err.value.details, err.value.details
        assert "127.0.0.1:1" not in err.value.details
        final = await ask(address, "What is moving?", Mode.DRAFT_ONLY, max_new=4)
        assert final.token_ids
    finally:
        await edge.stop(0)


async def test_cloud_dying_mid_request_gives_a_clear_error() -> None:
    stack = await eh.start_stack(slow=(0.1, 0.2))
    try:
        import asyncio

        async def kill_soon() -> None:
            # Mid-request: the cloud holds the session (60 paced steps take 12 s).
            await until(lambda: stack.cloud.live_sessions == 1, "the request reached the cloud")
            await stack.cloud.stop(0)

        killer = asyncio.create_task(kill_soon())
        with pytest.raises(AskError) as err:
            await ask(stack.edge_address, "What is moving?", Mode.SPECULATIVE, max_new=60)
        await killer
        assert err.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        assert "cloud verifier" in err.value.details
        final = await ask(stack.edge_address, "What is moving?", Mode.DRAFT_ONLY, max_new=4)
        assert final.token_ids
    finally:
        await stack.edge.stop(0)


async def test_speculation_always_drafts_on_a_fast_cloud_and_stays_lossless() -> None:
    # A slow prefill but fast steps: the plan alone would not draft after prefill.
    stack = await eh.start_stack(slow=(0.5, 0.0), edge_settings={"speculation": "always"})
    try:
        for question in QUESTIONS:
            a = await ask(stack.edge_address, question, Mode.SPECULATIVE, max_new=16)
            b = await ask(stack.edge_address, question, Mode.TARGET_ONLY, max_new=16)
            assert a.token_ids == b.token_ids
            assert a.stats.drafted > 0 and a.stats.hidden_drafted > 0
            assert a.plan is not None and a.plan.speculate
    finally:
        await stack.stop()
