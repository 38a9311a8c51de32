"""``--engine``: the static engine serves through the real server on CPU (same code path
as on CUDA, minus graphs) and gives the HF reference's tokens; auto picks hf on CPU; a
model the static engine cannot serve falls back to hf with the reason logged."""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import replace

import pytest

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.static.build import kv_bytes_per_slot
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.server import VerifierServer, build_engine, choose_engine
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
    monkeypatch.setattr("eventspec.cloud.server.static_unsupported_reason",
                        lambda t: "rope type 'yarn'")
    with caplog.at_level(logging.WARNING, logger="eventspec.cloud.server"):
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
                       engine=kind, max_seq_len=128)
    with caplog.at_level(logging.INFO, logger="eventspec.cloud.server"):
        engine = build_engine(settings, target)
    logged = re.findall(r"KV capacity: (\d+) KV slots", caplog.text)
    assert logged == [str(engine.num_slots)], caplog.text
    assert engine.num_slots == (4 if kind == "static" else 5)


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


async def test_chunked_prefill_serves_the_same_answers_to_requests_at_once() -> None:
    """``--prefill-chunk 16``: prompts go in 16-token chunks while other requests decode,
    and every answer is the HF engine's, asked one at a time."""
    answers: dict[str, list[list[int]]] = {}
    for kind, chunk in (("hf", "off"), ("static", "16")):
        settings = replace(h.settings(kv_cache_gb=0.05), engine=kind, prefill_chunk=chunk)
        server = VerifierServer(settings, target=build_tiny_random_target(seed=0),
                                cost=h.TEST_COST)
        await server.start()
        try:
            asks = [h.run_generate(server.port, h.open_msg(q, h.make_frames(i),
                                                           max_new_tokens=12), hidden=[5, 6])
                    for i, q in enumerate(QUESTIONS)]
            # hf: one at a time; static: all at once, so prompts chunk beside decoding.
            outs = [await a for a in asks] if kind == "hf" else await asyncio.gather(*asks)
            answers[kind] = [o.tokens for o in outs]
            assert server.runtime is not None
            chunks = server.runtime.scheduler.stats.prefill_chunks
            assert (chunks >= len(QUESTIONS)) if kind == "static" else chunks == 0
        finally:
            await server.stop()
    assert answers["static"] == answers["hf"]


async def test_batch_invariant_serving_answers_as_hf_does_at_once() -> None:
    """``--batch-invariant`` (static engine on CPU): requests at once, speculative with
    hidden drafts, get the HF engine's one-at-a-time answers."""
    answers: dict[str, list[list[int]]] = {}
    for kind, invariant in (("hf", False), ("auto", True)):
        settings = replace(h.settings(kv_cache_gb=0.05), engine=kind, batch_invariant=invariant)
        server = VerifierServer(settings, target=build_tiny_random_target(seed=0),
                                cost=h.TEST_COST)
        await server.start()
        try:
            asks = [h.run_generate(server.port, h.open_msg(q, h.make_frames(i),
                                                           max_new_tokens=12), hidden=[5, 6])
                    for i, q in enumerate(QUESTIONS)]
            outs = [await a for a in asks] if kind == "hf" else await asyncio.gather(*asks)
            answers[kind] = [o.tokens for o in outs]
            assert server.runtime is not None
            engine = server.runtime.scheduler.engine
            assert isinstance(engine, StaticEngine) == invariant
            assert getattr(engine, "batch_invariant", False) == invariant
        finally:
            await server.stop()
    assert answers["auto"] == answers["hf"]
