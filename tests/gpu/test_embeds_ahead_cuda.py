"""A prompt's tower on the side stream beside graphed steps (``make test-gpu``): the
code path ``tests/unit/cloud/test_embeds_ahead.py`` runs on a CPU, where no stream
exists. The toy target in float32 on the engine thread's high-priority stream
(``engine_stream``): embeddings made on the side stream while a session's graphed steps
run give the bits made alone, and the steps' answer is the one they give with no
tower beside them; and the host launches a tower without waiting for the side
stream's queued work.
"""

from __future__ import annotations

import pytest
import torch

from eventspec.cloud.engine.ahead import engine_stream
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.target import TargetModel
from eventspec.shared.node.static.batch import StepBatch
from tests.support.toy_cuda import toy_engine, toy_target

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def toy() -> TargetModel:
    return toy_target()


@pytest.fixture(scope="module")
def engine(toy: TargetModel) -> StaticEngine:
    return toy_engine(toy)


def _request(target: TargetModel, slot: int, question: str, seed: int) -> PrefillRequest:
    g = target.geometry
    pix = torch.randn(1, g.num_frames, 3, g.image_size, g.image_size,
                      generator=torch.Generator().manual_seed(seed))  # [1, F, 3, S, S]
    return PrefillRequest(slot, target.build_prompt_ids(question), pixel_values_videos=pix)


def _steps(engine: StaticEngine, target: TargetModel, req: PrefillRequest, first: int,
           n: int) -> list[int]:
    """``n`` greedy tokens after ``first`` through graphed one-token steps."""
    vocab, start, out = target.text_vocab_size, len(req.input_ids), [first]
    for i in range(n):
        batch = StepBatch((req.slot,), (start + i,), (1,),
                          torch.tensor([out[-1]], dtype=torch.long, device="cuda"))
        out.append(int(engine.step(batch)[0, :vocab].argmax()))
    return out[1:]


def test_a_tower_beside_graphed_steps_changes_neither(engine: StaticEngine,
                                                      toy: TargetModel) -> None:
    assert engine.tower_graph is not None and engine.side.stream is not None
    decoding = _request(toy, 0, "What is moving?", seed=1)
    newcomer = _request(toy, 1, "How many objects cross from the left?", seed=2)
    vocab = toy.text_vocab_size
    with engine_stream(engine.device):
        alone = engine.prompt_embeds(newcomer).clone()  # [L, H]
        first = int(engine.prefill([decoding])[0, :vocab].argmax())
        answer = _steps(engine, toy, decoding, first, 24)
        for _ in range(3):
            assert int(engine.prefill([decoding])[0, :vocab].argmax()) == first
            made = [engine.prompt_embeds_ahead(newcomer) for _ in range(2)]
            assert _steps(engine, toy, decoding, first, 24) == answer  # towers beside
            for m in made:
                assert torch.equal(m.take(), alone)
    torch.cuda.synchronize()
    engine.free(0)


def test_the_host_launches_a_tower_without_waiting_for_the_side_stream(
        engine: StaticEngine, toy: TargetModel) -> None:
    """A copy from pageable memory on the side stream made the host wait for the work
    queued there (another prompt's tower) before it could launch the next step."""
    side = engine.side.stream
    assert side is not None
    newcomer = _request(toy, 1, "How many objects cross from the left?", seed=2)
    with engine_stream(engine.device):
        engine.prompt_embeds(newcomer)  # pinned blocks and the graph warm
        torch.cuda.synchronize()
        slept = torch.cuda.Event()
        with torch.cuda.stream(side):
            torch.cuda._sleep(500_000_000)  # the side stream busy for a few tenths of a second
            slept.record(side)
        made = engine.prompt_embeds_ahead(newcomer)
        assert not slept.query(), "the host waited for the side stream's queued work"
        assert not made.ready
        made.take()
    torch.cuda.synchronize()
