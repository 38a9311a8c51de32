"""Chunked prefill, decode first, in the engine loop (``--prefill-chunk``).

Against a deterministic fake engine whose answer is a hash of the whole sequence: every
answer must equal target-only decoding whatever the chunk size and arrival pattern; a
session that decodes keeps stepping between the chunks of a newcomer's prompt; with
nothing decoding a prompt goes whole; a bad prompt fails alone.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspec.cloud.scheduling.prefill_calls import PrefillCalls
from eventspec.cloud.scheduling.prefill_chunking import (
    AUTO_MIN_CHUNK_TOKENS,
    CHUNK_QUANTUM,
    ChunkPolicy,
    auto_chunk_tokens,
)
from eventspec.cloud.scheduling.prefill_queue import (
    SHORT_TAIL_TOKENS,
    SHORT_TAILS_PER_CALL,
    PrefillQueue,
)
from eventspec.cloud.scheduling.sampler import BatchedSampler, PendingVerdicts, Verdict
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.step_kinds import StepKind
from eventspec.cloud.scheduling.tickets import Failure, Ticket
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.types import FinishReason
from tests.support.fake_engine import (
    TEXT_VOCAB,
    ChunkedFakeEngine,
    FakeEngine,
    MixedFakeEngine,
    target_only,
)
from tests.support.scheduler_sessions import answer, submit
from tests.support.waiting import until

MAX_SEQ = 64


async def _ask(sched: Scheduler, name: str, prompt: tuple[int, ...], max_new: int) -> Ticket:
    return submit(sched, name, prompt, max_new, max_seq_len=MAX_SEQ)


def _prompt(seed: int, n: int) -> tuple[int, ...]:
    return tuple(3 + (seed * 7 + i * 13) % 28 for i in range(n))


@settings(max_examples=30, deadline=None)
@given(chunk=st.integers(1, 12), lengths=st.lists(st.integers(1, 40), min_size=1, max_size=5),
       max_new=st.integers(1, 12), stagger=st.booleans())
def test_chunked_answers_equal_target_only(chunk: int, lengths: list[int], max_new: int,
                                           stagger: bool) -> None:
    async def go() -> None:
        engine = ChunkedFakeEngine(num_slots=5, max_seq_len=MAX_SEQ)
        sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB,
                          prefill_chunk=ChunkPolicy("fixed", chunk))
        sched.start()
        try:
            tickets = []
            for i, n in enumerate(lengths):
                tickets.append(await _ask(sched, f"r{i}", _prompt(i, n), max_new))
                if stagger:  # later requests arrive while earlier ones decode
                    await asyncio.sleep(0)
            results = await asyncio.gather(*(answer(t) for t in tickets))
        finally:
            await asyncio.to_thread(sched.stop)
        for i, (n, got) in enumerate(zip(lengths, results, strict=True)):
            assert got == target_only(_prompt(i, n), max_new, MAX_SEQ), i
        chunks = [piece for kind, pieces in engine.events if kind == "chunk" for piece in pieces]
        assert chunks, "chunking was on: prompts go through prefill_chunks"

    asyncio.run(go())


async def _beside_a_decoding_session(engine: ChunkedFakeEngine, chunk: int,
                                     newcomer: tuple[int, ...], max_new: int
                                     ) -> tuple[Ticket, Ticket]:
    """A request that decodes 30 tokens, and ``newcomer`` queued while its second step
    runs; both answers must be target-only's. Returns (the decoding one, the newcomer)."""
    seed = _long_answer_seed()
    engine.hold_second_step = True
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB,
                      prefill_chunk=ChunkPolicy("fixed", chunk))
    sched.start()
    try:
        first = await _ask(sched, "decoding", _prompt(seed, 3), 30)
        await until(engine.held.is_set, "the first request decodes")
        new = await _ask(sched, "new", newcomer, max_new)  # queued while a step runs
        engine.gate.set()
        results = await asyncio.gather(answer(first), answer(new))
    finally:
        engine.gate.set()
        await asyncio.to_thread(sched.stop)
    assert results == [target_only(_prompt(seed, 3), 30, MAX_SEQ),
                       target_only(newcomer, max_new, MAX_SEQ)]
    return first, new


def _long_answer_seed(n: int = 30) -> int:
    """A prompt seed whose answer runs ``n`` tokens without EOS (it decodes all along)."""
    return next(s for s in range(100) if len(target_only(_prompt(s, 3), n, MAX_SEQ)) == n)


async def test_a_decoding_session_steps_between_the_chunks_of_a_long_prompt() -> None:
    engine = ChunkedFakeEngine(num_slots=2, max_seq_len=MAX_SEQ)
    first, long = await _beside_a_decoding_session(engine, 4, _prompt(2, 30), 2)
    long_chunks = [i for i, (kind, pieces) in enumerate(engine.events)
                   if kind == "chunk" and any(p[0] == long.slot for p in pieces)]  # type: ignore[index]
    assert len(long_chunks) == 30 // 4 + 1  # 4 tokens a call while the other decodes
    for a, b in itertools.pairwise(long_chunks):
        between = engine.events[a + 1 : b]
        assert any(kind == "step" and first.slot in slots for kind, slots in between), \
            "the decoding session waited for more than one chunk"


async def test_a_request_cancelled_between_its_chunks_stops_and_frees_its_slot() -> None:
    """Cancelled after its first chunk: no further chunk is written, its slot comes back,
    and the session decoding beside it answers as if it had been alone."""
    seed = _long_answer_seed()
    engine = ChunkedFakeEngine(num_slots=2, max_seq_len=MAX_SEQ)
    engine.hold_second_step = True
    engine.hold_after_chunk_call = 2  # the first call was the decoding request's prompt
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB, prefill_chunk=ChunkPolicy("fixed", 4))
    sched.start()
    try:
        first = await _ask(sched, "decoding", _prompt(seed, 3), 30)
        await until(engine.held.is_set, "the first request decodes")
        long = await _ask(sched, "long", _prompt(2, 30), 4)
        engine.gate.set()
        await until(engine.chunk_held.is_set, "the long prompt's first chunk is written")
        sched.cancel(long)
        engine.chunk_gate.set()
        results = await asyncio.gather(answer(first), answer(long))
    finally:
        engine.gate.set()
        engine.chunk_gate.set()
        await asyncio.to_thread(sched.stop)
    assert results[0] == target_only(_prompt(seed, 3), 30, MAX_SEQ)
    assert results[1] == [] and long.session.finish_reason == FinishReason.CANCELLED
    long_chunks = [p for kind, pieces in engine.events if kind == "chunk"
                   for p in pieces if p[0] == long.slot]  # type: ignore[index]
    assert long_chunks == [(long.slot, 0, 4)]
    assert engine.slots[long.slot] is None and sched.pool.free == 2


async def test_with_nothing_decoding_a_prompt_goes_whole() -> None:
    engine = ChunkedFakeEngine(num_slots=1, max_seq_len=MAX_SEQ)
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB, prefill_chunk=ChunkPolicy("fixed", 4))
    sched.start()
    try:
        ticket = await _ask(sched, "alone", _prompt(3, 30), 3)
        result = await answer(ticket)
    finally:
        await asyncio.to_thread(sched.stop)
    assert result == target_only(_prompt(3, 30), 3, MAX_SEQ)
    assert [e for e in engine.events if e[0] == "chunk"] == [("chunk", [(ticket.slot, 0, 30)])]


async def test_a_bad_prompt_fails_alone_among_chunks() -> None:
    engine = ChunkedFakeEngine(num_slots=3, max_seq_len=MAX_SEQ)
    engine.poison = 31
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB, prefill_chunk=ChunkPolicy("fixed", 64))
    sched.start()
    try:
        good = await _ask(sched, "good", _prompt(4, 10), 4)
        bad = await _ask(sched, "bad", (5, 6, 31, 7), 4)
        results = await asyncio.gather(answer(good), answer(bad))
    finally:
        await asyncio.to_thread(sched.stop)
    assert results[0] == target_only(_prompt(4, 10), 4, MAX_SEQ)
    assert isinstance(results[1], Failure) and "poisoned" in str(results[1].error)
    assert sched.pool.free == 3


def test_an_engine_without_chunks_prefills_whole_prompts() -> None:
    sched = Scheduler(FakeEngine(1), text_vocab_size=TEXT_VOCAB,
                      prefill_chunk=ChunkPolicy("fixed", 4))
    assert not sched.chunking.enabled


@pytest.mark.parametrize("text, want", [("off", ChunkPolicy("off")), ("AUTO", ChunkPolicy("auto")),
                                        ("256", ChunkPolicy("fixed", 256))])
def test_the_flag_parses(text: str, want: ChunkPolicy) -> None:
    assert ChunkPolicy.parse(text) == want


@pytest.mark.parametrize("text", ["", "0", "-3", "big", "1.5"])
def test_a_bad_flag_names_itself(text: str) -> None:
    with pytest.raises(ValueError, match="--prefill-chunk"):
        ChunkPolicy.parse(text)


def _cost(step_base: float, per_token: float, prefill_per_token: float) -> CloudCost:
    return CloudCost(prefill_base_ms=2.0, prefill_ms_per_visual_token=prefill_per_token,
                     prefill_ms_per_text_token=prefill_per_token, step_base_ms=step_base,
                     step_ms_per_token=per_token, step_ms_per_session=0.1)


@given(step_base=st.floats(0.5, 50), per_token=st.floats(0, 1),
       prefill=st.floats(1e-3, 1), sessions=st.integers(1, 64), budget=st.integers(1, 4096))
def test_auto_chunks_are_quantised_bounded_and_cost_about_a_step(
        step_base: float, per_token: float, prefill: float, sessions: int, budget: int) -> None:
    cost = _cost(step_base, per_token, prefill)
    tokens = auto_chunk_tokens(cost, sessions, sessions, budget)
    upper = max(CHUNK_QUANTUM, budget // CHUNK_QUANTUM * CHUNK_QUANTUM)
    assert tokens % CHUNK_QUANTUM == 0
    assert min(AUTO_MIN_CHUNK_TOKENS, upper) <= tokens <= upper
    # Not clamped: its cost is within a quantum of a step's.
    if AUTO_MIN_CHUNK_TOKENS < tokens < upper:
        chunk_ms = cost.prefill_base_ms + tokens * prefill
        step_ms = cost.batch_step_ms(sessions, sessions)
        assert chunk_ms <= step_ms < chunk_ms + CHUNK_QUANTUM * prefill + 1e-9


def test_auto_chunks_grow_with_the_step() -> None:
    small = auto_chunk_tokens(_cost(5, 0.01, 0.001), 1, 1, 4096)
    large = auto_chunk_tokens(_cost(20, 0.01, 0.001), 64, 64, 4096)
    assert AUTO_MIN_CHUNK_TOKENS <= small < large
    assert ChunkPolicy("auto").budget(_cost(5, 0.01, 0.025), 0, 0, 2048) is None


def test_auto_never_cuts_a_full_size_prompt_into_launch_bound_chunks() -> None:
    """The H200's calibrated costs (``e2e-h200-b.json``: 0.024-0.025 ms per prompt
    token, no per-call term, a 4.8 ms step + 0.23 ms per extra session) gave 320-token
    chunks at 16 sessions, and a chunk call of up to 512 tokens costs 11-14 ms whatever
    its size (``chunked-prefill-h200.json``)."""
    cost = CloudCost(prefill_base_ms=0.0, prefill_ms_per_visual_token=0.025058,
                     prefill_ms_per_text_token=0.023930, step_base_ms=4.834,
                     step_ms_per_token=0.01117, step_ms_per_session=0.22867)
    assert auto_chunk_tokens(cost, 16, 16, 2048) == AUTO_MIN_CHUNK_TOKENS
    # A small model's budget below the floor: the floor gives way to it.
    assert auto_chunk_tokens(cost, 16, 16, 256) == 256


@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6),
       budgets=st.lists(st.integers(1, 40), min_size=1, max_size=40))
def test_pieces_take_the_oldest_first_and_cover_each_prompt_once(
        lengths: list[int], budgets: list[int]) -> None:
    queue = PrefillQueue(2048)
    tickets = [object() for _ in lengths]
    for t, n in zip(tickets, lengths, strict=True):
        queue.add(t, _Request(n))  # type: ignore[arg-type]
    written: dict[int, list[tuple[int, int]]] = {i: [] for i in range(len(lengths))}
    for budget in budgets:
        pieces = queue.next_pieces(budget, lambda ticket: True)
        if not pieces:
            break
        assert sum(p.end - p.start for p in pieces) <= max(1, budget)
        order = [tickets.index(p.pending.ticket) for p in pieces]
        assert order == sorted(order)
        assert all(p.finishes for p in pieces[:-1]), "only the last piece may stop short"
        PrefillQueue.advance(pieces)
        for p, i in zip(pieces, order, strict=True):
            written[i].append((p.start, p.end))
    for i, n in enumerate(lengths):
        spans = written[i]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
        if spans and spans[-1][1] == n:
            assert spans[0][0] == 0


@given(prompts=st.lists(st.tuples(st.integers(1, 120), st.integers(0, 119)), min_size=1,
                        max_size=8),
       budget=st.integers(1, 200))
def test_a_reused_prefixs_question_rides_first_outside_the_budget(
        prompts: list[tuple[int, int]], budget: int) -> None:
    """A hit's few remaining rows go into the next call whatever the queue ahead of them
    (up to SHORT_TAILS_PER_CALL rows), and the other prompts keep their budget and order."""
    queue = PrefillQueue(2048)
    tickets = [object() for _ in prompts]
    reused = {}
    for t, (n, hit) in zip(tickets, prompts, strict=True):
        pending = queue.add(t, _Request(n))  # type: ignore[arg-type]
        if 0 < hit < n:  # as reuse_prefix records a hit
            pending.done = pending.reused = hit
            reused[t] = n - hit
    pieces = queue.next_pieces(budget, lambda ticket: True)
    # The short tails that fit the call's room, oldest first, ride first and finish.
    room, expected = SHORT_TAILS_PER_CALL, []
    for t in tickets:
        if t in reused and reused[t] <= min(SHORT_TAIL_TOKENS, room):
            expected.append(t)
            room -= reused[t]
    tails, rest = pieces[:len(expected)], pieces[len(expected):]
    assert [p.pending.ticket for p in tails] == expected
    assert all(p.finishes and p.start == p.pending.reused for p in tails)
    assert sum(p.end - p.start for p in tails) <= SHORT_TAILS_PER_CALL
    assert sum(p.end - p.start for p in rest) <= max(1, budget)
    # The rest keep first-come order, and the oldest of them gets at least one row.
    order = [tickets.index(p.pending.ticket) for p in rest]
    assert order == sorted(order)
    others = [t for t in tickets if t not in expected]
    if others:
        assert rest and rest[0].pending.ticket is others[0]


class _Request:
    def __init__(self, n: int) -> None:
        self.input_ids = list(range(n))
        self.pixel_values_videos = None  # text only: no piece runs a tower


@settings(max_examples=30, deadline=None)
@given(chunk=st.integers(1, 12), lengths=st.lists(st.integers(1, 40), min_size=2, max_size=5),
       max_new=st.integers(2, 12))
def test_mixed_steps_answer_as_target_only(chunk: int, lengths: list[int],
                                          max_new: int) -> None:
    """Chunks riding the decoding sessions' step: every answer equals target-only, and
    while anyone decodes no chunk runs in a call of its own."""
    async def go() -> None:
        engine = MixedFakeEngine(num_slots=5, max_seq_len=MAX_SEQ)
        sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB,
                          prefill_chunk=ChunkPolicy("fixed", chunk))
        assert sched.mixed_steps
        sched.start()
        try:
            first = await _ask(sched, "r0", _prompt(0, lengths[0]), max_new)
            await until(lambda: first.session.prefilled, "the first request decodes")
            rest = [await _ask(sched, f"r{i}", _prompt(i, n), max_new)
                    for i, n in enumerate(lengths[1:], start=1)]
            results = await asyncio.gather(*(answer(t) for t in [first, *rest]))
        finally:
            await asyncio.to_thread(sched.stop)
        for i, (n, got) in enumerate(zip(lengths, results, strict=True)):
            assert got == target_only(_prompt(i, n), max_new, MAX_SEQ), i
        mixed = [e for kind, e in engine.events if kind == "mixed"]
        for steps, pieces in mixed:
            assert steps and pieces and not set(steps) & {s for s, _, _ in pieces}  # type: ignore[union-attr]

    asyncio.run(go())


async def test_a_mixed_step_carries_a_newcomers_chunks_beside_a_decoding_session() -> None:
    engine = MixedFakeEngine(num_slots=3, max_seq_len=MAX_SEQ)
    old, new = await _beside_a_decoding_session(engine, 4, _prompt(2, 17), 3)
    mixed = [e for kind, e in engine.events if kind == "mixed"]
    assert all(old.slot in steps for steps, _ in mixed)  # type: ignore[misc, operator]
    assert [p for _, pieces in mixed for p in pieces] == [  # type: ignore[attr-defined, misc]
        (new.slot, 0, 4), (new.slot, 4, 8), (new.slot, 8, 12), (new.slot, 12, 16),
        (new.slot, 16, 17)]
    assert [e for kind, e in engine.events if kind == "chunk"] == [[(old.slot, 0, 3)]], \
        "a chunk ran in a call of its own while a session decoded"


async def test_a_mixed_steps_sampler_is_queued_before_the_pieces_first_tokens(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop launches the step's sampler right after the step (its device work queues
    behind it) and reads the verdicts only after its other host work: here the first
    tokens of the prompts the mixed step finished, which wait on the device too."""
    events: list[str] = []
    launch, result = BatchedSampler.launch, PendingVerdicts.result
    after = PrefillCalls.after_pieces

    def logged_launch(self: BatchedSampler, *args: Any) -> PendingVerdicts:
        events.append("launch")
        return launch(self, *args)

    def logged_result(self: PendingVerdicts) -> list[Verdict]:
        events.append("result")
        return result(self)

    def logged_after(self: PrefillCalls, *args: Any, **kw: Any) -> None:
        mixed = not kw["own_call"]  # the first request's prompt ran in a call of its own
        events.append("pieces" if mixed else "own call")
        after(self, *args, **kw)
        events.append("pieces done" if mixed else "own call done")

    monkeypatch.setattr(BatchedSampler, "launch", logged_launch)
    monkeypatch.setattr(PendingVerdicts, "result", logged_result)
    monkeypatch.setattr(PrefillCalls, "after_pieces", logged_after)
    await _beside_a_decoding_session(MixedFakeEngine(num_slots=3, max_seq_len=MAX_SEQ), 4,
                                     _prompt(2, 17), 3)
    riding = [i for i, e in enumerate(events) if e == "pieces"]
    assert len(riding) == 5  # the newcomer's five pieces rode five steps
    for i in riding:
        assert events[i - 1] == "launch", "the pieces' work came before the step's sampler"
        done = events.index("pieces done", i)
        assert events[done + 1] == "result"
    # The last piece finished the prompt: its first token was sampled in between.
    assert events[riding[-1] + 1 : riding[-1] + 3] == ["launch", "result"]


async def test_a_bad_prompt_in_a_mixed_step_fails_alone() -> None:
    """The mixed call fails: its chunks run apart (the bad one fails alone) and the
    decoding session's step runs plain; its answer is untouched."""
    seed = _long_answer_seed()
    engine = MixedFakeEngine(num_slots=3, max_seq_len=MAX_SEQ)
    engine.poison, engine.hold_second_step = 31, True
    sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB, prefill_chunk=ChunkPolicy("fixed", 64))
    sched.start()
    try:
        old = await _ask(sched, "old", _prompt(seed, 3), 30)
        await until(engine.held.is_set, "the first request decodes")
        bad = await _ask(sched, "bad", (5, 6, 31, 7), 4)
        good = await _ask(sched, "good", _prompt(4, 10), 4)
        engine.gate.set()
        results = await asyncio.gather(answer(old), answer(bad), answer(good))
    finally:
        engine.gate.set()
        await asyncio.to_thread(sched.stop)
    assert results[0] == target_only(_prompt(seed, 3), 30, MAX_SEQ)
    assert isinstance(results[1], Failure) and "poisoned" in str(results[1].error)
    assert results[2] == target_only(_prompt(4, 10), 4, MAX_SEQ)
    assert sched.pool.free == 3
    assert not [e for kind, e in engine.events if kind == "mixed"
                and bad.slot in {s for s, _, _ in e[1]}]  # type: ignore[misc, union-attr]
    # The plain step after the failed mixed one is recorded under its own kind.
    assert sched.stats.kinds.steps(StepKind.FALLBACK) == 1


def test_mixed_steps_can_be_turned_off() -> None:
    engine = MixedFakeEngine(num_slots=2, max_seq_len=MAX_SEQ)
    assert Scheduler(engine, text_vocab_size=TEXT_VOCAB,
                     prefill_chunk=ChunkPolicy("fixed", 8)).mixed_steps
    assert not Scheduler(engine, text_vocab_size=TEXT_VOCAB).mixed_steps  # chunking off
    assert not Scheduler(engine, text_vocab_size=TEXT_VOCAB, prefill_chunk=ChunkPolicy("fixed", 8),
                         mixed_steps=False).mixed_steps  # --mixed-steps off
    engine.mixed_steps = False  # e.g. batch-invariant
    assert not Scheduler(engine, text_vocab_size=TEXT_VOCAB,
                         prefill_chunk=ChunkPolicy("fixed", 8)).mixed_steps
