"""A prompt's video tower ahead of its first piece (``eventspec.cloud.engine.ahead``).

The queue rule (hypothesis): while sessions decode, the pieces stop at the first prompt
whose tower still runs, and none overtakes it; the prompts to start are the oldest whose
tower has not started, within the limit. Through the real loop, on a fake engine whose
tower finishes when the test says: the decoding session keeps stepping while the
newcomer's tower runs, its pieces ride only once it is done, and every answer equals
target-only; with nothing decoding, the newcomer does not wait; an engine that rejects
a prompt ahead fails it alone. On the static engine (CPU): the embeddings made ahead
are the ones made at the piece, bit for bit, and a bad prompt is refused before the
tower runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from eventspec.cloud.engine.ahead import AheadEmbeds, SideStream, index_tensor
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.build import build_static_engine, static_kv_plan
from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy
from eventspec.cloud.scheduling.prefill_queue import TOWERS_PER_STEP, PrefillQueue
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.tickets import Failure, Ticket
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.batch import StepBatch
from tests.support.fake_engine import TEXT_VOCAB, MixedFakeEngine, target_only
from tests.support.scheduler_sessions import answer, session_factory
from tests.support.waiting import until

MAX_SEQ = 64
PIXELS = torch.zeros(1)  # the fake engine never looks at them: they only mark a tower


class _Event:
    """A stand-in for a CUDA event: done when the test sets it."""

    def __init__(self, done: threading.Event) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done.is_set()


class _Request:
    def __init__(self, n: int, pixels: bool) -> None:
        self.input_ids = list(range(n))
        self.pixel_values_videos = PIXELS if pixels else None


@given(prompts=st.lists(st.tuples(st.integers(1, 30), st.booleans(), st.sampled_from(
    ["none", "running", "done"])), min_size=1, max_size=6), budget=st.integers(1, 80),
       wait=st.booleans())
def test_pieces_stop_at_the_first_running_tower_while_sessions_decode(
        prompts: list[tuple[int, bool, str]], budget: int, wait: bool) -> None:
    queue, never = PrefillQueue(2048), threading.Event()
    done = threading.Event()
    done.set()
    for n, pixels, tower in prompts:
        pending = queue.add(object(), _Request(n, pixels))  # type: ignore[arg-type]
        if pixels and tower != "none":
            pending.ahead = AheadEmbeds(torch.zeros(n, 1), 0, _Event(
                done if tower == "done" else never))  # type: ignore[arg-type]
    waiting = list(queue._waiting)
    pieces = queue.next_pieces(budget, lambda ticket: True, wait_for_towers=wait)
    taken = [p.pending for p in pieces]
    assert taken == waiting[:len(taken)], "first come, first served"
    blocked = next((i for i, p in enumerate(waiting) if p.tower_due or p.tower_running),
                   None)
    if wait and blocked is not None:
        assert len(taken) <= blocked, "a piece of a prompt whose tower is not made, or behind"
        if blocked == 0:
            assert not pieces
    elif not wait:
        assert taken, "the oldest prompt always gets a row"
    # A prompt whose tower runs ahead is not priced as running one in the step.
    assert not any(p.tower for p in pieces if p.pending.ahead is not None)


@given(prompts=st.lists(st.tuples(st.booleans(), st.booleans()), max_size=8),
       limit=st.integers(0, 4))
def test_the_towers_to_start_are_the_oldest_due_one_a_step_within_the_limit(
        prompts: list[tuple[bool, bool]], limit: int) -> None:
    queue = PrefillQueue(2048)
    for pixels, started in prompts:
        pending = queue.add(object(), _Request(5, pixels))  # type: ignore[arg-type]
        if pixels and started:
            pending.ahead = AheadEmbeds(torch.zeros(5, 1), 0)
    waiting = list(queue._waiting)
    due = [p for p in waiting if p.tower_due]
    in_flight = sum(p.ahead is not None for p in waiting)
    room = min(TOWERS_PER_STEP, limit - in_flight)  # one a step, the limit in all
    assert queue.towers_to_start(limit) == due[:max(0, room)]


def test_made_ahead_on_a_cpu_they_are_ready_at_once() -> None:
    made = SideStream(torch.device("cpu")).run(lambda: torch.arange(6.0).view(3, 2), 4)
    assert made.ready and made.start == 4
    assert torch.equal(made.take(), torch.arange(6.0).view(3, 2))


class _AheadFakeEngine(MixedFakeEngine):
    """``MixedFakeEngine`` whose towers run ahead and finish when ``tower_done`` is set;
    a prompt holding ``refuse`` is rejected ahead."""

    def __init__(self, num_slots: int) -> None:
        super().__init__(num_slots, MAX_SEQ)
        self.tower_done = threading.Event()
        self.ahead: list[int] = []  # slots whose tower started
        self.refuse: int | None = None
        #: When set, each plain step takes a permit the test gives (10 s at most).
        self.permits: threading.Semaphore | None = None

    def step(self, batch: StepBatch) -> torch.Tensor:
        if self.permits is not None:
            assert self.permits.acquire(timeout=10), "the test gave no permit for a step"
        return super().step(batch)

    def prompt_embeds_ahead(self, request: PrefillRequest, start: int = 0) -> AheadEmbeds:
        if self.refuse is not None and self.refuse in request.input_ids:
            raise InvalidInput("input_ids: a refused prompt")
        self.ahead.append(request.slot)
        return AheadEmbeds(self.prompt_embeds(request, start), start,
                           _Event(self.tower_done))


class _Watched(_AheadFakeEngine):
    """``_AheadFakeEngine`` that records every attribute looked up on it while
    ``looked_up`` is a list."""

    def __init__(self, num_slots: int) -> None:
        self.looked_up: list[str] | None = None
        super().__init__(num_slots)

    def __getattribute__(self, name: str) -> object:
        seen = object.__getattribute__(self, "looked_up")
        if seen is not None:
            seen.append(name)
        return object.__getattribute__(self, name)


def test_no_prompts_to_start_ahead_leave_the_engine_untouched() -> None:
    # After every step launch: it must cost nothing when there is nothing to start.
    engine = _Watched(num_slots=2)
    calls = Scheduler(engine, text_vocab_size=TEXT_VOCAB,
                      prefill_chunk=ChunkPolicy("fixed", 4)).engine_loop.prefill
    assert calls.engine is engine
    seen: list[str] = []
    engine.looked_up = seen
    calls.embed_ahead([])
    assert seen == []


def _ask(sched: Scheduler, name: str, prompt: Sequence[int], max_new: int) -> Ticket:
    ticket = sched.admit(name, session_factory(max_new, len(prompt), MAX_SEQ))
    sched.submit_prefill(ticket, prompt, pixel_values_videos=PIXELS)
    return ticket


def _prompt(seed: int, n: int) -> tuple[int, ...]:
    return tuple(3 + (seed * 7 + i * 13) % 28 for i in range(n))


def _long_seed() -> int:
    """A prompt whose target-only answer runs to 40 tokens (no early EOS)."""
    return next(s for s in range(500) if len(target_only(_prompt(s, 3), 40, MAX_SEQ)) == 40)


def _steps(engine: MixedFakeEngine) -> int:
    return sum(kind in ("step", "mixed") for kind, _ in engine.events)


def _pieces_of(engine: MixedFakeEngine, slot: int) -> list[tuple[int, int, int]]:
    return [p for kind, e in engine.events if kind in ("mixed", "chunk")
            for p in (e[1] if kind == "mixed" else e)  # type: ignore[union-attr]
            if p[0] == slot]  # type: ignore[index]


def _held(engine: _AheadFakeEngine) -> Scheduler:
    """A scheduler over ``engine`` (4-row pieces) whose plain steps wait for the test's
    permits."""
    engine.permits = threading.Semaphore(0)
    return Scheduler(engine, text_vocab_size=TEXT_VOCAB, prefill_chunk=ChunkPolicy("fixed", 4))


async def _one_decoding(sched: Scheduler) -> tuple[Ticket, int]:
    """A request whose answer runs to 40 tokens, once it decodes, and its prompt's seed."""
    seed = _long_seed()
    old = _ask(sched, "old", _prompt(seed, 3), 40)
    await until(lambda: old.session.prefilled, "the first request decodes")
    return old, seed


async def _newcomer_beside_a_decoding_session(
        sched: Scheduler, engine: _AheadFakeEngine,
        while_its_tower_runs: Callable[[Ticket], Awaitable[None]]) -> Ticket:
    """Start ``sched``; once a request decodes, a newcomer arrives; its tower starts and
    runs until ``while_its_tower_runs`` returns, then finishes. Both answers are
    checked against target-only; returns the newcomer's ticket."""
    sched.start()
    try:
        old, seed = await _one_decoding(sched)
        assert engine.ahead == [], "a prompt alone went whole, with no tower ahead"
        engine.tower_done.clear()
        new = _ask(sched, "new", _prompt(5, 10), 4)
        # The step under way ends; the next iteration queues the newcomer, and its tower
        # starts once that iteration's step is launched.
        assert engine.permits is not None
        engine.permits.release(2)
        await until(lambda: engine.ahead == [new.slot], "the newcomer's tower started")
        await while_its_tower_runs(new)
        engine.tower_done.set()
        engine.permits.release(100)
        results = await asyncio.gather(answer(old), answer(new))
    finally:
        engine.tower_done.set()
        if engine.permits is not None:
            engine.permits.release(100)
        await asyncio.to_thread(sched.stop)
    assert results == [target_only(_prompt(seed, 3), 40, MAX_SEQ),
                       target_only(_prompt(5, 10), 4, MAX_SEQ)]
    return new


async def test_steps_go_on_while_a_newcomers_tower_runs_and_its_pieces_follow() -> None:
    engine = _AheadFakeEngine(num_slots=3)
    sched = _held(engine)  # the old session steps when the test says

    async def steps_go_on(new: Ticket) -> None:
        before = _steps(engine)
        assert engine.permits is not None
        engine.permits.release(3)
        await until(lambda: _steps(engine) >= before + 3, "the old session steps on")
        assert not _pieces_of(engine, new.slot), "a piece rode before its tower finished"

    new = await _newcomer_beside_a_decoding_session(sched, engine, steps_go_on)
    assert _pieces_of(engine, new.slot)[0][1] == 0
    assert engine.embedded.count((new.slot, 0)) == 1, "the embeddings were made twice"


async def test_slack_prices_a_tower_beside_the_step_it_starts_after() -> None:
    """Under ``slack`` with towers ahead: the iteration that will start a newcomer's
    tower sizes its pieces with one tower beside the step, and the step it started
    after reports it (its device time includes the tower's)."""
    engine = _AheadFakeEngine(num_slots=3)
    engine.permits = threading.Semaphore(0)
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB,
                      prefill_chunk=ChunkPolicy("slack", ratio=1.5, pace_ms=200.0))
    slack = sched.plans.slack
    assert slack is not None
    chose: list[int] = []
    observed: list[int] = []
    choose, observe = slack.choose, slack.observe
    slack.choose = lambda *a, **k: (chose.append(k["beside"]), choose(*a, **k))[1]  # type: ignore[method-assign]
    slack.observe = lambda *a, **k: (observed.append(a[3]), observe(*a, **k))[1]  # type: ignore[method-assign]

    async def reported(new: Ticket) -> None:
        assert engine.permits is not None
        engine.permits.release(3)
        await until(lambda: 1 in observed, "the step the tower started after reported it")
        assert 1 in chose, "its pieces were sized without the tower beside the step"

    await _newcomer_beside_a_decoding_session(sched, engine, reported)
    assert observed.count(1) == 1 and max(observed) == 1


async def test_with_nothing_decoding_a_prompt_does_not_wait_for_its_tower() -> None:
    engine = _AheadFakeEngine(num_slots=2)  # tower_done never set: always "running"
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB, prefill_chunk=ChunkPolicy("fixed", 4))
    sched.start()
    try:
        got = await answer(_ask(sched, "only", _prompt(2, 9), 3))
    finally:
        await asyncio.to_thread(sched.stop)
    assert got == target_only(_prompt(2, 9), 3, MAX_SEQ)


async def test_a_prompt_refused_ahead_fails_alone() -> None:
    engine = _AheadFakeEngine(num_slots=4)
    engine.tower_done.set()
    engine.refuse = 31
    sched = _held(engine)
    sched.start()
    try:
        old, seed = await _one_decoding(sched)
        bad = _ask(sched, "bad", (5, 6, 31, 7), 4)
        good = _ask(sched, "good", _prompt(4, 10), 4)
        engine.permits.release(200)
        results = await asyncio.gather(answer(old), answer(bad), answer(good))
    finally:
        engine.permits.release(200)
        await asyncio.to_thread(sched.stop)
    assert isinstance(results[1], Failure) and "refused" in str(results[1].error)
    assert results[0] == target_only(_prompt(seed, 3), 40, MAX_SEQ)
    assert results[2] == target_only(_prompt(4, 10), 4, MAX_SEQ)
    assert engine.ahead == [good.slot]
    assert sched.pool.free == 4


@pytest.fixture(scope="module")
def tiny() -> TargetModel:
    return build_tiny_random_target(seed=0)


def test_the_static_engines_embeddings_ahead_are_the_pieces(tiny: TargetModel) -> None:
    kv = static_kv_plan(tiny, kv_cache_bytes=None, max_seq_len=320, max_slots=2)
    engine = build_static_engine(tiny, kv, use_graphs=False)
    g = tiny.geometry
    pixels = torch.randn((1, g.num_frames, 3, g.image_size, g.image_size),
                         generator=torch.Generator().manual_seed(3))  # [1, F, 3, S, S]
    req = PrefillRequest(slot=1, input_ids=tiny.build_prompt_ids("What moves?"),
                         pixel_values_videos=pixels)
    made = engine.prompt_embeds_ahead(req, 0)
    assert made.ready and made.start == 0
    assert torch.equal(made.take(), engine.prompt_embeds(req, 0))
    rest = engine.prompt_embeds_ahead(req, len(req.input_ids) - 2)  # text rows only
    assert torch.equal(rest.take(), engine.prompt_embeds(req)[-2:])


def test_a_bad_prompt_is_refused_ahead_before_the_tower_runs(
        tiny: TargetModel, monkeypatch: pytest.MonkeyPatch) -> None:
    kv = static_kv_plan(tiny, kv_cache_bytes=None, max_seq_len=320, max_slots=2)
    engine = build_static_engine(tiny, kv, use_graphs=False)
    calls: list[int] = []
    real = tiny.video_features_from_pixels
    monkeypatch.setattr(tiny, "video_features_from_pixels",
                        lambda pix: calls.append(1) or real(pix))
    ids = [i for i in tiny.build_prompt_ids("What moves?") if i != tiny.video_token_id]
    g = tiny.geometry
    req = PrefillRequest(slot=0, input_ids=ids, pixel_values_videos=torch.zeros(
        1, g.num_frames, 3, g.image_size, g.image_size))
    with pytest.raises(InvalidInput, match="placeholders"):
        engine.prompt_embeds_ahead(req)
    whole = tiny.build_prompt_ids("What moves?")
    with pytest.raises(InvalidInput, match=f"prompt rows from {len(whole)} "):
        engine.prompt_embeds_ahead(PrefillRequest(
            slot=0, input_ids=whole, pixel_values_videos=req.pixel_values_videos), len(whole))
    assert not calls


@given(values=st.lists(st.integers(0, 2**40), max_size=50))
def test_index_tensors_hold_the_values(values: list[int]) -> None:
    got = index_tensor(values, torch.device("cpu"))
    assert got.dtype == torch.long and got.tolist() == values
