"""``--engine``: the static engine serves through the real server on CPU (same code path
as on CUDA, minus graphs) and gives the HF reference's tokens; auto picks hf on CPU; a
model the static engine cannot serve falls back to hf with the reason logged."""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import replace

import pytest

from eventspec.cloud.config import CloudSettings
from eventspec.cloud.engine.choice import choose_engine
from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.static.build import kv_bytes_per_slot
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.server import VerifierServer, build_engine
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from tests.support import cloud_harness as h

QUESTIONS = ["What is moving?", "Which way does the red square go?", "How many objects?"]


@pytest.fixture(scope="module")
def target() -> TargetModel:
    return build_tiny_random_target(seed=0)


def test_auto_is_hf_on_cpu(target: TargetModel) -> None:
    assert choose_engine("auto", target) == "hf"
    assert choose_engine("static", target) == "static"


def test_unsupported_model_falls_back_with_a_logged_reason(
    target: TargetModel, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("eventspec.cloud.engine.choice.static_unsupported_reason",
                        lambda t: "rope type 'yarn'")
    with caplog.at_level(logging.WARNING, logger="eventspec.cloud.engine.choice"):
        assert choose_engine("static", target) == "hf"
    assert "rope type 'yarn'" in caplog.text


def test_build_engine_honours_the_choice(target: TargetModel) -> None:
    settings = replace(h.settings(kv_cache_gb=0.05), engine="static")
    engine = build_engine(settings, build_tiny_random_target(seed=0))
    assert isinstance(engine, StaticEngine)
    assert isinstance(build_engine(replace(settings, engine="hf"), target), HFEngine)


@pytest.mark.parametrize("kind", ["static", "hf"])
def test_the_logged_kv_capacity_is_what_the_engine_built(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A budget of exactly five slots (and a session cap above it): the static engine
    # keeps one of them as its padding slot, the hf engine uses all five.
    target = build_tiny_random_target(seed=0)  # the static engine fuses its weights
    per_slot = kv_bytes_per_slot(target, 128)
    settings = replace(h.settings(kv_cache_gb=(5 * per_slot + 1024) / 2**30, max_sessions=16),
                       engine=kind, max_seq_len=128, kv_layout="slots")
    with caplog.at_level(logging.INFO, logger="eventspec.cloud.server"):
        engine = build_engine(settings, target)
    logged = re.findall(r"KV capacity: (\d+) KV slots", caplog.text)
    assert logged == [str(engine.num_slots)], caplog.text
    assert engine.num_slots == (4 if kind == "static" else 5)


def test_kv_by_length_is_one_arena_less_a_padding_window(
    caplog: pytest.LogCaptureFixture
) -> None:
    # The same budget by length: every position but one slot's worth of scratch is
    # the arena (5 x 128 + 1 positions less 128), for up to --max-sessions requests.
    target = build_tiny_random_target(seed=0)
    per_slot = kv_bytes_per_slot(target, 128)
    per_token = per_slot // 128
    settings = replace(h.settings(kv_cache_gb=(5 * per_slot + per_token) / 2**30,
                                  max_sessions=16), engine="static", max_seq_len=128)
    with caplog.at_level(logging.INFO, logger="eventspec.cloud.server"):
        engine = build_engine(settings, target)
    assert isinstance(engine, StaticEngine)
    assert engine.kv_positions == 5 * 128 + 1 - 128
    assert engine.num_slots == 16
    logged = re.findall(r"KV by length: an arena of (\d+) positions", caplog.text)
    assert logged == [str(engine.kv_positions)], caplog.text
    hf = build_engine(replace(settings, engine="hf"), target)  # no arena: slots
    assert getattr(hf, "kv_positions", None) is None and hf.num_slots == 5


async def test_static_engine_serves_what_hf_serves_over_grpc() -> None:
    answers: dict[str, list[list[int]]] = {}
    for kind in ("hf", "static"):
        settings = replace(h.settings(kv_cache_gb=0.05), engine=kind)
        server = VerifierServer(settings, target=build_tiny_random_target(seed=0),
                                cost=h.TEST_COST)
        await server.start()
        try:
            answers[kind] = []
            for i, q in enumerate(QUESTIONS):
                frames = h.make_frames(i)
                out = await h.run_generate(server.port, h.open_msg(q, frames, max_new_tokens=12),
                                           hidden=[5, 6])
                answers[kind].append(out.tokens)
        finally:
            await server.stop()
    assert answers["static"] == answers["hf"]
    assert all(answers["hf"])


async def _ask_all(settings: CloudSettings, *, at_once: bool
                   ) -> tuple[list[list[int]], Scheduler]:
    """Every question, speculative with hidden drafts, one at a time or all at once;
    the answers and the server's engine loop (read after it stopped)."""
    server = VerifierServer(settings, target=build_tiny_random_target(seed=0),
                            cost=h.TEST_COST)
    await server.start()
    try:
        asks = [h.run_generate(server.port, h.open_msg(q, h.make_frames(i), max_new_tokens=12),
                               hidden=[5, 6])
                for i, q in enumerate(QUESTIONS)]
        outs = await asyncio.gather(*asks) if at_once else [await a for a in asks]
        assert server.runtime is not None
        return [o.tokens for o in outs], server.runtime.scheduler
    finally:
        await server.stop()


async def test_chunked_prefill_serves_the_same_answers_to_requests_at_once() -> None:
    """``--prefill-chunk 16``: prompts go in 16-token chunks while other requests decode,
    and every answer is the HF engine's, asked one at a time."""
    base = h.settings(kv_cache_gb=0.05)
    hf, hf_loop = await _ask_all(replace(base, engine="hf"), at_once=False)
    chunked, loop = await _ask_all(replace(base, engine="static", prefill_chunk="16"),
                                   at_once=True)
    assert chunked == hf
    assert hf_loop.stats.prefill_chunks == 0
    assert loop.stats.prefill_chunks >= len(QUESTIONS)


async def test_batch_invariant_serving_answers_as_hf_does_at_once() -> None:
    """``--batch-invariant`` (static engine on CPU): requests at once, speculative with
    hidden drafts, get the HF engine's one-at-a-time answers."""
    base = h.settings(kv_cache_gb=0.05)
    hf, _ = await _ask_all(replace(base, engine="hf"), at_once=False)
    invariant, loop = await _ask_all(replace(base, batch_invariant=True), at_once=True)
    assert invariant == hf
    assert isinstance(loop.engine, StaticEngine) and loop.engine.batch_invariant
