"""Chunked prefill and prefix reuse in the static engine, on CPU in fp32.

A prompt prefilled in chunks (any sizes, interleaved with other sessions' steps) must
leave the same K/V and give the same first-token logits and the same greedy answer as
one whole prefill; a saved prompt prefix loaded into another slot and continued must
equal a cold prefill of that prompt. These are what make the scheduler's chunking
and the prefix cache lossless.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventspec.cloud.engine.base import ChunkedPrefillEngine, PrefillChunk, PrefillRequest
from eventspec.cloud.engine.static.build import build_static_engine, static_kv_plan
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.node.static.batch import StepBatch

ATOL = 2e-4
QUESTIONS = ("What is moving?", "How many cars cross the road from the left side?")


@pytest.fixture(scope="module")
def tiny() -> TargetModel:
    return build_tiny_random_target(seed=0)


@pytest.fixture(scope="module")
def engine(tiny: TargetModel) -> StaticEngine:
    kv = static_kv_plan(tiny, kv_cache_bytes=None, max_seq_len=256, max_slots=4)
    return build_static_engine(tiny, kv, use_graphs=False)


def request(target: TargetModel, slot: int, question: str, seed: int = 0) -> PrefillRequest:
    g = target.geometry
    pix = torch.randn((1, g.num_frames, 3, g.image_size, g.image_size),
                      generator=torch.Generator().manual_seed(seed))  # [1, F, 3, S, S]
    return PrefillRequest(slot, target.build_prompt_ids(question), pixel_values_videos=pix)


def greedy(engine: StaticEngine, target: TargetModel, slot: int, start: int,
           first: torch.Tensor, n: int) -> list[int]:
    """n greedy tokens of the session in ``slot`` whose prompt is ``start`` long."""
    vocab = target.text_vocab_size
    out = [int(first[:vocab].argmax())]
    for i in range(n - 1):
        batch = StepBatch((slot,), (start + i,), (1,), torch.tensor([out[-1]]))
        out.append(int(engine.step(batch)[0, :vocab].argmax()))
    return out


def chunked(engine: StaticEngine, req: PrefillRequest, sizes: list[int], *,
            with_ids: bool = False) -> torch.Tensor:
    """Prefill ``req`` in pieces of ``sizes`` (the last takes the rest); the last
    piece's [V] logits. ``with_ids``: each chunk names its token ids, as the scheduler's
    do, so the engine may run text chunks as a step."""
    embeds = engine.prompt_embeds(req)  # [L, H]
    start, logits = 0, None
    for size in [*sizes, embeds.shape[0]]:
        end = min(embeds.shape[0], start + size)
        if end == start:
            break
        ids = tuple(int(i) for i in req.input_ids[start:end]) if with_ids else None
        logits = engine.prefill_chunks([PrefillChunk(req.slot, start, embeds[start:end],
                                                     ids)])[0]
        start = end
    assert logits is not None
    return logits


def test_the_static_engine_offers_chunks_and_prefixes(engine: StaticEngine) -> None:
    assert isinstance(engine, ChunkedPrefillEngine)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 64), min_size=1, max_size=6), q=st.sampled_from(QUESTIONS))
def test_a_prompt_in_chunks_equals_it_whole(engine: StaticEngine, tiny: TargetModel,
                                            sizes: list[int], q: str) -> None:
    whole_req = request(tiny, 0, q)
    whole = engine.prefill([whole_req])[0]  # [V]
    part = chunked(engine, request(tiny, 1, q), sizes)  # [V]
    torch.testing.assert_close(part, whole, rtol=0, atol=ATOL)
    n = len(whole_req.input_ids)
    torch.testing.assert_close(engine.k_cache[:, 1, :, :n], engine.k_cache[:, 0, :, :n],
                               rtol=0, atol=ATOL)
    assert greedy(engine, tiny, 1, n, part, 8) == greedy(engine, tiny, 0, n, whole, 8)
    engine.free(0)
    engine.free(1)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6), q=st.sampled_from(QUESTIONS))
def test_text_chunks_run_as_a_step_and_equal_the_prompt_whole(
        engine: StaticEngine, tiny: TargetModel, sizes: list[int], q: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks that name their ids: those of text only that continue a prompt and fit
    a step run as one (``prompt_rows_as_step``); the answer is still the whole
    prompt's. The last chunk of a prompt ends in its question, text only."""
    as_step = []
    real = engine.prompt_rows_as_step

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        as_step.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "prompt_rows_as_step", spy)
    whole_req = request(tiny, 0, q)
    whole = engine.prefill([whole_req])[0]  # [V]
    part = chunked(engine, request(tiny, 1, q), sizes, with_ids=True)  # [V]
    torch.testing.assert_close(part, whole, rtol=0, atol=ATOL)
    n = len(whole_req.input_ids)
    torch.testing.assert_close(engine.k_cache[:, 1, :, :n], engine.k_cache[:, 0, :, :n],
                               rtol=0, atol=ATOL)
    assert greedy(engine, tiny, 1, n, part, 8) == greedy(engine, tiny, 0, n, whole, 8)
    ids = list(whole_req.input_ids)
    starts = [0]
    for size in sizes:
        starts.append(min(n, starts[-1] + size))
    text_steps = [a for a, b in zip(starts, [*starts[1:], n], strict=True)
                  if 0 < a < b and tiny.video_token_id not in ids[a:b]
                  and b - a <= max(engine.token_buckets)]
    assert len(as_step) == len(text_steps)
    engine.free(0)
    engine.free(1)


def test_a_question_after_a_prefix_runs_as_a_step(engine: StaticEngine,
                                                  tiny: TargetModel) -> None:
    """The prefix cache's case: a clip's prefix loaded into a fresh slot and a new
    question after it, as a step, equals the cold prefill of that prompt."""
    cold_req = request(tiny, 0, QUESTIONS[0])
    cold = engine.prefill([cold_req])[0]  # [V]
    ids = cold_req.input_ids
    video_end = max(i for i, t in enumerate(ids) if t == tiny.video_token_id)
    k, v = engine.save_prefix(0, video_end + 1)
    engine.load_prefix(2, k, v)
    rest = tuple(int(i) for i in ids[video_end + 1 :])
    assert engine.fits_a_step([video_end + 1], [len(rest)])
    warm = engine.prompt_rows_as_step([2], [video_end + 1], [rest])[0]  # [V]
    torch.testing.assert_close(warm, cold, rtol=0, atol=ATOL)
    n = len(ids)
    assert greedy(engine, tiny, 2, n, warm, 8) == greedy(engine, tiny, 0, n, cold, 8)
    engine.free(0)
    engine.free(2)


def test_prompt_rows_as_a_step_are_checked_before_any_work(engine: StaticEngine,
                                                           tiny: TargetModel) -> None:
    req = request(tiny, 3, QUESTIONS[0])
    embeds = engine.prompt_embeds(req)
    before = engine.k_cache[:, 3].clone()
    with pytest.raises(InvalidInput, match="slot 3 holds 0 prompt positions, not 5"):
        engine.prompt_rows_as_step([3], [5], [(7, 8)])
    with pytest.raises(InvalidInput, match="names 1 token ids"):
        engine.prefill_chunks([PrefillChunk(3, 0, embeds[:2], (7,))])
    with pytest.raises(InvalidInput, match="does not fit"):
        engine.prompt_rows_as_step([3], [250], [(7,) * 10])
    assert torch.equal(engine.k_cache[:, 3], before)
    assert not engine.fits_a_step([0], [4])  # a prompt's first rows are a prefill
    assert not engine.fits_a_step([5], [max(engine.token_buckets) + 1])
    assert not engine.fits_a_step([5] * (engine.num_slots + 1), [1] * (engine.num_slots + 1))
    with pytest.raises(InvalidInput, match="holds no prefilled session"):
        engine.step(StepBatch((3,), (5,), (1,), torch.tensor([7])))


def test_chunks_interleave_with_other_sessions_steps(engine: StaticEngine,
                                                     tiny: TargetModel) -> None:
    """Session A decodes between the chunks of B's prefill: both answers are what each
    gets alone."""
    a, b = request(tiny, 0, QUESTIONS[0], seed=1), request(tiny, 1, QUESTIONS[1], seed=2)
    la, lb = len(a.input_ids), len(b.input_ids)
    alone_a = greedy(engine, tiny, 0, la, engine.prefill([a])[0], 6)
    alone_b = greedy(engine, tiny, 1, lb, engine.prefill([b])[0], 6)
    engine.free(0)
    engine.free(1)
    tokens_a = [int(engine.prefill([a])[0][: tiny.text_vocab_size].argmax())]
    embeds = engine.prompt_embeds(b)  # [Lb, H]
    start, vocab = 0, tiny.text_vocab_size
    first_b = None
    while start < lb:
        end = min(lb, start + 9)
        first_b = engine.prefill_chunks([PrefillChunk(1, start, embeds[start:end])])[0]
        start = end
        batch = StepBatch((0,), (la + len(tokens_a) - 1,), (1,), torch.tensor([tokens_a[-1]]))
        tokens_a.append(int(engine.step(batch)[0, :vocab].argmax()))
    assert first_b is not None
    assert tokens_a[:6] == alone_a
    assert greedy(engine, tiny, 1, lb, first_b, 6) == alone_b
    engine.free(0)
    engine.free(1)


def test_a_chunk_must_continue_where_the_slot_ended(engine: StaticEngine,
                                                    tiny: TargetModel) -> None:
    req = request(tiny, 2, QUESTIONS[0])
    embeds = engine.prompt_embeds(req)
    with pytest.raises(InvalidInput, match="slot 2 holds 0 prompt positions, not 5"):
        engine.prefill_chunks([PrefillChunk(2, 5, embeds[5:9])])
    engine.prefill_chunks([PrefillChunk(2, 0, embeds[:5])])
    with pytest.raises(InvalidInput, match="not 4"):
        engine.prefill_chunks([PrefillChunk(2, 4, embeds[4:9])])
    engine.free(2)  # forgets what it held
    with pytest.raises(InvalidInput, match="holds 0"):
        engine.prefill_chunks([PrefillChunk(2, 5, embeds[5:9])])
    with pytest.raises(InvalidInput, match="at least one"):
        engine.prefill_chunks([])


def test_a_saved_prefix_continued_equals_a_cold_prefill(engine: StaticEngine,
                                                        tiny: TargetModel) -> None:
    """Two questions about one clip share the prompt up to the end of the video rows:
    the second loads the first's prefix and prefills only its own text."""
    first = request(tiny, 0, QUESTIONS[0], seed=3)
    second = request(tiny, 1, QUESTIONS[1], seed=3)
    ids_a, ids_b = list(first.input_ids), list(second.input_ids)
    shared = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y)
    assert shared > tiny.geometry.visual_tokens  # the video rows are in the prefix
    engine.prefill([first])
    k, v = engine.save_prefix(0, shared)
    engine.free(0)
    cold = engine.prefill([second])[0]  # [V]
    n = len(ids_b)
    cold_tokens = greedy(engine, tiny, 1, n, cold, 8)
    engine.free(1)
    engine.load_prefix(2, k, v)
    embeds = engine.prompt_embeds(dataclass_replace(second, slot=2))  # [Lb, H]
    warm = engine.prefill_chunks([PrefillChunk(2, shared, embeds[shared:])])[0]
    torch.testing.assert_close(warm, cold, rtol=0, atol=ATOL)
    assert greedy(engine, tiny, 2, n, warm, 8) == cold_tokens
    engine.free(2)
    with pytest.raises(InvalidInput, match="cannot save"):
        engine.save_prefix(2, 4)
    with pytest.raises(InvalidInput, match="a prefix must be"):
        engine.load_prefix(2, k[:1], v[:1])


def dataclass_replace(req: PrefillRequest, slot: int) -> PrefillRequest:
    return PrefillRequest(slot, req.input_ids, req.pixel_values_videos, req.video_features)


@pytest.fixture(scope="module")
def fixed_engine(tiny: TargetModel) -> StaticEngine:
    """Mixed steps at fixed shapes: pieces padded to 64-row tiles in buckets of 64,
    128 or 192 rows (on CPU the same forward the GPU graphs capture, run eagerly)."""
    kv = static_kv_plan(tiny, kv_cache_bytes=None, max_seq_len=256, max_slots=4)
    return build_static_engine(tiny, kv, use_graphs=False, chunk_buckets=(64, 128, 192))


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(12, 130), drafts=st.lists(st.integers(0, 4), min_size=1, max_size=6),
       seed=st.integers(0, 3))
@pytest.mark.parametrize("shapes", ["exact", "fixed"])
def test_a_mixed_step_equals_the_step_and_the_chunk_apart(
    tiny: TargetModel, size: int, drafts: list[int], seed: int, shapes: str,
    engine: StaticEngine, fixed_engine: StaticEngine,
) -> None:
    """Session A steps (with 0..4 draft rows a step) while B's prompt goes in chunks of
    ``size`` inside the same forward: A's rows and B's first-token row equal what the
    step and the chunks give apart, and both answers are what each gets alone. Both
    ways a mixed step runs: at exact shapes, and padded to fixed ones."""
    engine = engine if shapes == "exact" else fixed_engine
    a, b = request(tiny, 0, QUESTIONS[0], seed=seed), request(tiny, 1, QUESTIONS[1], seed=9)
    la, lb, vocab = len(a.input_ids), len(b.input_ids), tiny.text_vocab_size
    alone_b = greedy(engine, tiny, 1, lb, engine.prefill([b])[0], 6)
    engine.free(1)
    first_a = engine.prefill([a])[0]
    tokens_a = [int(first_a[:vocab].argmax())]
    embeds = engine.prompt_embeds(b)  # [Lb, H]
    start, i, first_b = 0, 0, None
    gen = torch.Generator().manual_seed(seed)
    while start < lb:
        end = min(lb, start + size)
        k = drafts[i % len(drafts)]
        fed = [tokens_a[-1], *torch.randint(3, vocab, (k,), generator=gen).tolist()]
        batch = StepBatch((0,), (la + len(tokens_a) - 1,), (len(fed),), torch.tensor(fed))
        step, chunk = engine.step_with_chunks(batch, [PrefillChunk(1, start,
                                                                   embeds[start:end])])
        assert step.shape == (len(fed), tiny.vocab_size) and chunk.shape == (1, tiny.vocab_size)
        apart = engine.step(batch)  # the same positions again: A's rows alone
        torch.testing.assert_close(step, apart, rtol=0, atol=ATOL)
        first_b, start, i = chunk[0], end, i + 1
        tokens_a.append(int(step[0, :vocab].argmax()))  # drafts all rejected: one token
    assert first_b is not None
    assert greedy(engine, tiny, 1, lb, first_b, 6) == alone_b
    engine.free(1)
    alone_a = greedy(engine, tiny, 0, la, first_a, len(tokens_a))
    assert tokens_a == alone_a
    engine.free(0)


def test_fixed_mixed_steps_carry_two_pieces_and_fall_back_beyond_the_buckets(
        fixed_engine: StaticEngine, tiny: TargetModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """B's last rows and C's first rows in one fixed-shape step (each padded to whole
    tiles), equal to each prompt whole; pieces past the largest bucket run at exact
    shapes, and so do more pieces than a fixed step holds."""
    engine, vocab = fixed_engine, tiny.text_vocab_size
    fixed: list[int] = []
    real = engine._forward_mixed

    def spy(*args: Any) -> torch.Tensor:
        fixed.append(args[1].rows)
        return real(*args)

    monkeypatch.setattr(engine, "_forward_mixed", spy)
    a, b, c = (request(tiny, s, QUESTIONS[s % 2], seed=s) for s in (0, 1, 2))
    whole_b, whole_c = engine.prefill([b])[0], engine.prefill([c])[0]
    engine.free(1)
    engine.free(2)
    first_a = engine.prefill([a])[0]
    la, lb = len(a.input_ids), len(b.input_ids)
    eb, ec = engine.prompt_embeds(b), engine.prompt_embeds(c)
    engine.prefill_chunks([PrefillChunk(1, 0, eb[: lb - 70])])
    token = int(first_a[:vocab].argmax())
    batch = StepBatch((0,), (la,), (1,), torch.tensor([token]))
    step, firsts = engine.step_with_chunks(batch, [PrefillChunk(1, lb - 70, eb[lb - 70 :]),
                                                   PrefillChunk(2, 0, ec[:50])])
    assert fixed == [192]  # 70 rows -> 2 tiles, 50 rows -> 1 tile
    torch.testing.assert_close(step, engine.step(batch), rtol=0, atol=ATOL)
    torch.testing.assert_close(firsts[0], whole_b, rtol=0, atol=ATOL)
    assert firsts.shape == (2, tiny.vocab_size)
    fed = [token] + [5] * 11  # 12 tokens: a step bucket past MIXED_MAX_TOKENS
    batch = StepBatch((0,), (la + 1,), (len(fed),), torch.tensor(fed))
    step, last_c = engine.step_with_chunks(batch, [PrefillChunk(2, 50, ec[50:])])
    assert fixed == [192]  # exact shapes
    torch.testing.assert_close(step, engine.step(batch), rtol=0, atol=ATOL)
    torch.testing.assert_close(last_c[0], whole_c, rtol=0, atol=ATOL)
    for slot in (0, 1, 2):
        engine.free(slot)


def test_a_mixed_step_checks_before_any_work(engine: StaticEngine, tiny: TargetModel) -> None:
    engine.free(1)
    a = request(tiny, 0, QUESTIONS[0])
    first = engine.prefill([a])[0]
    la = len(a.input_ids)
    batch = StepBatch((0,), (la,), (1,), torch.tensor([int(first.argmax())]))
    embeds = engine.prompt_embeds(request(tiny, 1, QUESTIONS[1]))
    with pytest.raises(InvalidInput, match="a slot both steps and prefills"):
        engine.step_with_chunks(batch, [PrefillChunk(0, 0, embeds[:4])])
    with pytest.raises(InvalidInput, match="must continue where the last ended"):
        engine.step_with_chunks(batch, [PrefillChunk(1, 3, embeds[3:8])])
    assert not engine.occupancy.is_live(1)  # nothing written, nothing marked
    engine.free(0)
