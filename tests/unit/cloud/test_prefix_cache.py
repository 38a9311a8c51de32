"""The prefix cache (``--prefix-cache-gb``): its keys, its byte bound and LRU order, and
the engine loop reusing a clip's prefix losslessly (fake engine)."""

from __future__ import annotations

import asyncio

import torch
from hypothesis import given
from hypothesis import strategies as st

from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy
from eventspec.cloud.scheduling.prefix_cache import (
    Prefix,
    PrefixCache,
    prefix_key,
    prefix_length,
    visual_key,
)
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.tickets import Failure, Ticket
from tests.support.fake_engine import TEXT_VOCAB, ChunkedFakeEngine, target_only
from tests.support.scheduler_sessions import answer, session_factory, submit

VIDEO = 3  # the fake prompts' <video> id
MAX_SEQ = 64


def _entry(nbytes: int) -> Prefix:
    t = torch.zeros(nbytes // 2, dtype=torch.uint8)
    return Prefix(t, t.clone(), 1)


def test_the_prefix_ends_after_the_last_video_row() -> None:
    assert prefix_length([1, 3, 3, 3, 9, 8], VIDEO) == 4
    assert prefix_length([1, 9, 8], VIDEO) == 0
    assert prefix_length([], VIDEO) == 0


def test_keys_depend_on_the_prefix_and_the_clip_only() -> None:
    clip = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)

    def key(ids: list[int], tensor: torch.Tensor) -> str:
        return prefix_key(ids, 3, visual_key(tensor=tensor))

    base = key([1, 3, 3, 9], clip)
    assert base == key([1, 3, 3, 7, 7], clip.clone())  # another question
    assert base != key([2, 3, 3, 9], clip)  # another prompt prefix
    other = clip.clone()
    other[1, 2, 3] += 1e-3
    assert base != key([1, 3, 3, 9], other)  # another clip
    assert base != key([1, 3, 3, 9], clip.to(torch.bfloat16))  # other bytes
    assert base != key([1, 3, 3, 9], clip.reshape(6, 4))  # other shape


def test_frames_are_keyed_by_their_encoded_bytes_and_how_they_split() -> None:
    frames = (b"\xff\xd8one", b"\xff\xd8two")
    assert visual_key(frames=frames) == visual_key(frames=tuple(bytes(f) for f in frames))
    assert visual_key(frames=frames) != visual_key(frames=(b"\xff\xd8on", b"e\xff\xd8two"))
    assert visual_key(frames=frames) != visual_key(frames=frames[::-1])
    # Frames and a tensor never share a key, even over the same bytes.
    raw = torch.frombuffer(bytearray(b"".join(frames)), dtype=torch.uint8)
    assert visual_key(frames=frames) != visual_key(tensor=raw)


def test_may_hold_follows_puts_and_evictions() -> None:
    cache = PrefixCache(100)
    assert not cache.may_hold("a")
    cache.put("a", _entry(60))
    assert cache.may_hold("a")
    cache.put("b", _entry(60))  # evicts a
    assert cache.may_hold("b") and not cache.may_hold("a")


@given(ops=st.lists(st.tuples(st.sampled_from("gp"), st.integers(0, 5), st.integers(2, 60)),
                    max_size=60))
def test_the_cache_keeps_to_its_bytes_and_evicts_the_least_recently_used(
        ops: list[tuple[str, int, int]]) -> None:
    cache = PrefixCache(100)
    model: list[tuple[str, int]] = []  # (key, bytes), least recently used first
    for op, k, size in ops:
        key = f"k{k}"
        if op == "g":
            got = cache.get(key)
            present = [m for m in model if m[0] == key]
            assert (got is None) == (not present)
            if present:
                model.remove(present[0])
                model.append(present[0])
        else:
            nbytes = size // 2 * 2
            kept = cache.put(key, _entry(nbytes))
            assert kept == (nbytes <= 100)
            if kept:
                model = [m for m in model if m[0] != key]
                while model and sum(b for _, b in model) + nbytes > 100:
                    model.pop(0)
                model.append((key, nbytes))
        assert cache.bytes == sum(b for _, b in model) <= 100
        assert len(cache) == len(model)


async def _ask(sched: Scheduler, prompt: tuple[int, ...], clip: torch.Tensor,
               max_new: int) -> tuple[list[int], Ticket]:
    ticket = submit(sched, "r", prompt, max_new, clip, max_seq_len=MAX_SEQ)
    got = await answer(ticket)
    assert isinstance(got, list), got
    sched.release(ticket)
    return got, ticket


@given(questions=st.lists(st.lists(st.integers(4, 30), min_size=1, max_size=8),
                          min_size=2, max_size=5),
       clips=st.lists(st.integers(0, 1), min_size=5, max_size=5),
       chunk=st.sampled_from([None, 3]))
def test_a_clip_asked_about_again_reuses_its_prefix_and_answers_the_same(
        questions: list[list[int]], clips: list[int], chunk: int | None) -> None:
    async def go() -> None:
        engine = ChunkedFakeEngine(num_slots=3, max_seq_len=MAX_SEQ)
        sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB, prefix_cache=PrefixCache(1 << 20),
                          video_token_id=VIDEO,
                          prefill_chunk=None if chunk is None else ChunkPolicy("fixed", chunk))
        sched.start()
        seen: set[int] = set()
        try:
            for q, c in zip(questions, clips, strict=False):
                prompt = (1, 2, VIDEO, VIDEO, VIDEO, 5 + c, *q)  # the clip shows in id 5 + c
                got, ticket = await _ask(sched, prompt, torch.full((2,), float(c)), 6)
                assert got == target_only(prompt, 6, MAX_SEQ)
                stats = ticket.session.stats()
                hit = c in seen
                assert stats.prefix_cache == ("hit" if hit else "miss")
                assert stats.prefix_reused_tokens == (5 if hit else 0)
                seen.add(c)
                # A hit embeds only the question's rows (the tower would not run).
                assert engine.embedded[-1] == (ticket.slot, 5 if hit else 0)
        finally:
            await asyncio.to_thread(sched.stop)

    asyncio.run(go())


def test_deferred_frames_that_fail_to_preprocess_fail_their_request_alone() -> None:
    """A request bet on a hit and deferred its frames; it missed, and its frames do not
    decode: that request fails with the error, and the loop serves the next one."""

    def broken(frames):  # type: ignore[no-untyped-def]
        raise ValueError("frame 0 is not a JPEG")

    async def go() -> None:
        engine = ChunkedFakeEngine(num_slots=2, max_seq_len=MAX_SEQ)
        sched = Scheduler(engine, text_vocab_size=TEXT_VOCAB, prefix_cache=PrefixCache(1 << 20),
                          video_token_id=VIDEO, preprocess_frames=broken)
        sched.start()
        try:
            prompt = (1, 2, VIDEO, VIDEO, VIDEO, 5, 9, 9)
            ticket = sched.admit("bet", session_factory(4, len(prompt), MAX_SEQ))
            sched.submit_prefill(ticket, prompt, visual_key="k", deferred_frames=(b"x",))
            failed = await answer(ticket)
            assert isinstance(failed, Failure) and "during prefill" in str(failed.error)
            got, _ = await _ask(sched, prompt, torch.full((2,), 1.0), 4)
            assert got == target_only(prompt, 4, MAX_SEQ)
        finally:
            await asyncio.to_thread(sched.stop)

    asyncio.run(go())
