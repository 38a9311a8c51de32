"""Step kinds through the real engine loop: the static engine on CPU (tiny random
target, fp32, no graphs), one session decoding while a second prompt arrives and rides
its steps in 64-row pieces. The prompt's video tower runs ahead of its first piece
(``PrefillCalls.embed_ahead``), so its pieces are ``piece``, ``piece`` and
``finishing``; with nothing made ahead the piece that starts it runs the tower in the
step and is ``tower``. The rest are ``plain`` or ``after_prefill``; where the engine has
no fixed shape for the pieces, every riding step is ``eager``. The kinds' steps add up
to the loop's, and the metrics label the step times with the same kinds.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from eventspec.cloud.engine.static.build import build_static_engine, static_kv_plan
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.metrics import CloudMetrics
from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy, graphed_piece_rows
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.step_kinds import StepKind
from eventspec.cloud.scheduling.tickets import Ticket
from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.types import GenerationSettings
from eventspec.shared.node.static.batch import StepBatch
from tests.support.cloud_harness import TEST_COST
from tests.support.scheduler_sessions import answer
from tests.support.waiting import until

MAX_SEQ = 320
POLICY = ChunkPolicy.parse("64")
#: The second prompt (185 rows) in 64-row pieces: 64 (its tower), 64, then its last 57.
SECOND = "How many cars cross the road from the left side?"


@pytest.fixture(scope="module")
def tiny() -> TargetModel:
    return build_tiny_random_target(seed=0)


def _engine(tiny: TargetModel, chunk_buckets: tuple[int, ...]) -> StaticEngine:
    kv = static_kv_plan(tiny, kv_cache_bytes=None, max_seq_len=MAX_SEQ, max_slots=4)
    return build_static_engine(tiny, kv, use_graphs=False, chunk_buckets=chunk_buckets)


def _ask(sched: Scheduler, tiny: TargetModel, name: str, question: str, max_new: int
         ) -> Ticket:
    """A target-only request whose answer runs to ``max_new`` (no EOS stops it)."""
    ids = tiny.build_prompt_ids(question)

    def make(slot: int) -> DecodingSession:
        return DecodingSession(
            settings=GenerationSettings(max_new_tokens=max_new), slot=slot,
            prompt_len=len(ids), max_seq_len=MAX_SEQ, eos_token_id=-1,
            max_verify_tokens=9, decode=lambda ids: "", speculative=False)

    g = tiny.geometry
    pixels = torch.randn((1, g.num_frames, 3, g.image_size, g.image_size),
                         generator=torch.Generator().manual_seed(len(name)))  # [1, F, 3, S, S]
    ticket = sched.admit(name, make)
    sched.submit_prefill(ticket, ids, pixel_values_videos=pixels)
    return ticket


async def _run(engine: StaticEngine, tiny: TargetModel, metrics: CloudMetrics,
               monkeypatch: pytest.MonkeyPatch, *, towers_ahead: bool = True) -> Scheduler:
    """The first request decodes; the second arrives and rides its steps; both finish.
    The first request's first step waits (bounded) until the second is queued, so the
    second always arrives while the first decodes, however fast the loop runs."""
    queued = threading.Event()
    real_step = engine.step

    def step(batch: StepBatch) -> torch.Tensor:
        assert queued.wait(timeout=30), "the second request was not queued"
        logits: torch.Tensor = real_step(batch)
        return logits

    monkeypatch.setattr(engine, "step", step)
    sched = Scheduler(engine, text_vocab_size=tiny.text_vocab_size, prefill_chunk=POLICY,
                      chunk_cost=TEST_COST, observer=metrics, towers_ahead=towers_ahead)
    assert sched.mixed_steps
    sched.start()
    try:
        first = _ask(sched, tiny, "first", "What is moving?", 24)
        await until(lambda: first.session.prefilled, "the first request decodes")
        second = _ask(sched, tiny, "second", SECOND, 4)
        queued.set()
        got = await asyncio.gather(answer(first), answer(second))
    finally:
        queued.set()
        await asyncio.to_thread(sched.stop)
    assert [len(g) if isinstance(g, list) else g for g in got] == [24, 4]
    return sched


def _labelled(metrics: CloudMetrics) -> dict[str, float]:
    """Steps per kind as ``engine_step_seconds`` counts them."""
    return {s.labels["kind"]: s.value for family in metrics.registry.collect()
            if family.name == "eventspec:engine_step_seconds" for s in family.samples
            if s.name.endswith("_count") and s.value}


async def test_a_riding_prompt_made_ahead_is_recorded_as_pieces_and_finishing(
        tiny: TargetModel, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(tiny, graphed_piece_rows(POLICY, MAX_SEQ))
    assert len(tiny.build_prompt_ids(SECOND)) == 185
    lookups: list[object] = []
    real_shape = engine._mixed_shape
    monkeypatch.setattr(engine, "_mixed_shape",
                        lambda *a: lookups.append(real_shape(*a)) or lookups[-1])
    metrics = CloudMetrics()
    stats = (await _run(engine, tiny, metrics, monkeypatch)).stats
    steps = {str(k): stats.kinds.steps(k) for k in StepKind if stats.kinds.steps(k)}
    assert steps["piece"] == 2 and steps["finishing"] == 1, steps
    # Each mixed step's shape is looked up once, by the engine, for the step and its kind.
    assert len(lookups) == 3 and None not in lookups, lookups
    assert set(steps) == {"piece", "finishing", "after_prefill", "plain"}
    assert sum(steps.values()) == stats.steps
    assert _labelled(metrics) == steps


async def test_a_riding_prompt_is_recorded_as_tower_piece_and_finishing(
        tiny: TargetModel, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(tiny, graphed_piece_rows(POLICY, MAX_SEQ))
    metrics = CloudMetrics()  # --towers-ahead off: the tower runs in the step
    stats = (await _run(engine, tiny, metrics, monkeypatch, towers_ahead=False)).stats
    steps = {str(k): stats.kinds.steps(k) for k in StepKind if stats.kinds.steps(k)}
    assert steps["tower"] == 1 and steps["piece"] == 1 and steps["finishing"] == 1, steps
    # The first prompt went whole (nothing decoded): its first step follows that call.
    assert steps["after_prefill"] == 1 and steps["plain"] >= 1
    assert set(steps) == {"tower", "piece", "finishing", "after_prefill", "plain"}
    assert sum(steps.values()) == stats.steps
    assert _labelled(metrics) == steps
    summary = stats.kinds.summary()
    tower = summary["kinds"]["tower"]
    assert tower["device_ms"]["n"] == 1 and tower["wall_ms"]["p50"] > 0
    # Every step after the first ends a gap; a step of two sessions counts two.
    assert summary["gap_ms"]["n"] >= stats.steps - 1
    assert summary["kinds"]["after_prefill"]["gap_ms"]["n"] == 0  # nothing ran before it


async def test_pieces_outside_the_fixed_shapes_are_recorded_as_eager(
        tiny: TargetModel, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(tiny, ())  # no piece bucket: every mixed step runs at exact shapes
    stats = (await _run(engine, tiny, CloudMetrics(), monkeypatch)).stats
    assert stats.kinds.steps(StepKind.EAGER) == 3
    for kind in (StepKind.TOWER, StepKind.PIECE, StepKind.FINISHING, StepKind.MULTI):
        assert stats.kinds.steps(kind) == 0
