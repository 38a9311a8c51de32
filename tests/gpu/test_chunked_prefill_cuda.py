"""Chunked prefill and prefix reuse on CUDA (``make test-gpu``): the same checks as
``tests/unit/cloud/test_chunked_prefill.py`` on the code only a GPU runs (the fused RoPE
+ KV write at a chunk's positions, masked SDPA, graphed steps after a chunked prompt).

The toy target in float32: a prompt prefilled in chunks, or continued after a loaded
prefix, gives first-token logits within 1e-3 of one whole prefill and the same greedy
answer through the graphed steps.
"""

from __future__ import annotations

import pytest
import torch

from eventspec.cloud.engine.base import PrefillChunk, PrefillRequest
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.target import TargetModel
from eventspec.shared.node.static.batch import StepBatch
from tests.support.toy_cuda import toy_engine, toy_target

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ATOL = 1e-3
ATOL_TF32 = 2e-2
QUESTIONS = ("What is moving?", "How many objects cross from the left?")


@pytest.fixture(scope="module")
def toy() -> TargetModel:
    return toy_target()


@pytest.fixture(scope="module")
def engine(toy: TargetModel) -> StaticEngine:
    return toy_engine(toy)


def _request(target: TargetModel, slot: int, question: str) -> PrefillRequest:
    g = target.geometry
    pix = torch.randn(1, g.num_frames, 3, g.image_size, g.image_size,
                      generator=torch.Generator().manual_seed(7)).to("cuda")  # [1,F,3,S,S]
    return PrefillRequest(slot, target.build_prompt_ids(question), pixel_values_videos=pix)


def _greedy(engine: StaticEngine, target: TargetModel, slot: int, start: int,
            first: torch.Tensor, n: int = 12) -> list[int]:
    vocab = target.text_vocab_size
    out = [int(first[:vocab].argmax())]
    for i in range(n - 1):
        batch = StepBatch((slot,), (start + i,), (1,),
                          torch.tensor([out[-1]], dtype=torch.long, device="cuda"))
        out.append(int(engine.step(batch)[0, :vocab].argmax()))
    return out


@pytest.mark.parametrize("size", [1, 37, 256])
def test_chunks_on_cuda_equal_a_whole_prefill(engine: StaticEngine, toy: TargetModel,
                                              size: int) -> None:
    whole_req, part_req = _request(toy, 0, QUESTIONS[0]), _request(toy, 1, QUESTIONS[0])
    whole = engine.prefill([whole_req])[0]
    embeds = engine.prompt_embeds(part_req)  # [L, H]
    n, start, last = embeds.shape[0], 0, None
    while start < n:
        end = min(n, start + size)
        last = engine.prefill_chunks([PrefillChunk(1, start, embeds[start:end])])[0]
        start = end
    assert last is not None
    torch.testing.assert_close(last, whole, rtol=0, atol=ATOL)
    assert _greedy(engine, toy, 1, n, last) == _greedy(engine, toy, 0, n, whole)
    engine.free(0)
    engine.free(1)


def test_a_loaded_prefix_on_cuda_equals_a_cold_prefill(engine: StaticEngine,
                                                       toy: TargetModel) -> None:
    first, second = _request(toy, 0, QUESTIONS[0]), _request(toy, 2, QUESTIONS[1])
    ids_a, ids_b = list(first.input_ids), list(second.input_ids)
    shared = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y)
    engine.prefill([first])
    k, v = engine.save_prefix(0, shared)
    cold = engine.prefill([PrefillRequest(1, ids_b, second.pixel_values_videos)])[0]
    engine.load_prefix(2, k, v)
    warm = engine.prefill_chunks([PrefillChunk(2, shared,
                                               engine.prompt_embeds(second, shared))])[0]
    torch.testing.assert_close(warm, cold, rtol=0, atol=ATOL)
    n = len(ids_b)
    assert _greedy(engine, toy, 2, n, warm) == _greedy(engine, toy, 1, n, cold)
    for slot in (0, 1, 2):
        engine.free(slot)


def test_a_continuation_chunk_never_runs_cudnn_attention(engine: StaticEngine,
                                                         toy: TargetModel) -> None:
    """cuDNN's SDPA builds a graph for every new (queries, keys) shape, hundreds of ms
    each, and chunk shapes vary request by request: an explicit boolean mask sent the
    continuation chunks there on an H200 (``chunked-prefill-h200.json``'s profile).
    The bottom-right causal bias runs flash / memory-efficient attention instead."""
    from torch.profiler import ProfilerActivity, profile

    req = _request(toy, 1, QUESTIONS[0])
    embeds = engine.prompt_embeds(req, 0)  # [L, H]
    cut = embeds.shape[0] // 2
    engine.free(1)
    engine.prefill_chunks([PrefillChunk(1, 0, embeds[:cut])])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.prefill_chunks([PrefillChunk(1, cut, embeds[cut:])])
        torch.cuda.synchronize()
    names = [e.key.lower() for e in prof.key_averages()]
    assert not [n for n in names if "cudnn" in n], names


@pytest.fixture(scope="module")
def graphed_mixed(toy: TargetModel) -> StaticEngine:
    """Mixed steps replayed from graphs: pieces padded to 64-row tiles, 64 or 256 rows."""
    return toy_engine(toy, chunk_buckets=(64, 256))


@pytest.mark.parametrize("size,drafts", [(16, 0), (64, 3), (200, 8)])
@pytest.mark.parametrize("graphed", [False, True])
def test_a_mixed_step_on_cuda_equals_the_step_and_the_chunk_apart(
    engine: StaticEngine, graphed_mixed: StaticEngine, toy: TargetModel, size: int,
    drafts: int, graphed: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Session A verifies ``drafts`` drafts a step while B's prompt rides the same
    forward: eager (split-KV rows and SDPA rows in one layer loop) or replayed from a
    mixed-step graph (the pieces in 64-query pseudo-sessions of the Triton split
    attention). A's rows are within 1e-3 of the graphed step alone (TF32's rounding
    where the pieces' attention differs) and B's answer is its whole-prefill answer."""
    if graphed:
        engine = graphed_mixed
        assert engine.mixed_graphs
        monkeypatch.setattr(engine, "_forward_mixed", None)  # replays only
    a, b = _request(toy, 0, QUESTIONS[0]), _request(toy, 1, QUESTIONS[1])
    la, lb, vocab = len(a.input_ids), len(b.input_ids), toy.text_vocab_size
    want_b = _greedy(engine, toy, 1, lb, engine.prefill([b])[0])
    engine.free(1)
    first_a = engine.prefill([a])[0]
    embeds = engine.prompt_embeds(b)  # [Lb, H]
    start, pos, token, first_b = 0, la, int(first_a[:vocab].argmax()), None
    while start < lb:
        end = min(lb, start + size)
        fed = [token, *range(5, 5 + drafts)]
        batch = StepBatch((0,), (pos,), (len(fed),),
                          torch.tensor(fed, dtype=torch.long, device="cuda"))
        step, chunk = engine.step_with_chunks(batch, [PrefillChunk(1, start, embeds[start:end])])
        torch.testing.assert_close(step, engine.step(batch), rtol=0, atol=ATOL)
        first_b, start, pos, token = chunk[0], end, pos + 1, int(step[0, :vocab].argmax())
    assert first_b is not None
    assert _greedy(engine, toy, 1, lb, first_b) == want_b
    engine.free(0)
    engine.free(1)


def test_a_question_after_a_loaded_prefix_replays_a_step_graph(
        engine: StaticEngine, toy: TargetModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefix cache's hit: the question's text rows, named by their ids, run as
    one graphed step (never the eager prefill), and give the cold prefill's answer."""
    req = _request(toy, 0, QUESTIONS[0])
    ids = [int(i) for i in req.input_ids]
    video_end = max(i for i, t in enumerate(ids) if t == toy.video_token_id) + 1
    cold = engine.prefill([req])[0]
    k, v = engine.save_prefix(0, video_end)
    engine.load_prefix(3, k, v)
    rest = tuple(ids[video_end:])
    chunk = PrefillChunk(3, video_end, engine.prompt_embeds(req, video_end), rest)
    assert engine.fits_a_step([video_end], [len(rest)])
    with monkeypatch.context() as m:
        m.setattr(engine, "prefill_embeds", None)  # calling it would raise
        warm = engine.prefill_chunks([chunk])[0]
    # The step's Triton attention takes its float32 dot products in TF32, the prefill's
    # SDPA in float32: the two agree to TF32's rounding, as every decode step does.
    torch.testing.assert_close(warm, cold, rtol=0, atol=ATOL_TF32)
    n = len(ids)
    assert _greedy(engine, toy, 3, n, warm) == _greedy(engine, toy, 0, n, cold)
    engine.free(0)
    engine.free(3)


def test_the_tower_graph_gives_the_eager_towers_bits(engine: StaticEngine,
                                                     toy: TargetModel) -> None:
    assert engine.tower_graph is not None
    for seed in (1, 2):
        pix = _request(toy, 0, QUESTIONS[0]).pixel_values_videos
        assert pix is not None
        pix = pix * seed
        eager = toy.project_video_features(toy.video_features_from_pixels(pix))
        assert torch.equal(engine.tower_graph(pix), eager.reshape(-1, eager.shape[-1]))
