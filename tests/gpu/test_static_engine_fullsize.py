"""The static engine at Video-LLaVA-7B shapes (random bf16 weights) with its production
buckets: 64 KV slots, so every (sessions, tokens) bucket of ``static_buckets`` (7 x 7)
is captured, as ``--engine auto`` captures them on a GPU deployment.

Sessions are not prefilled (a 2k-token video prompt per slot would cost minutes): the KV
cache is filled with random values and the slots are marked live, so every step attends
over random keys and values up to its session's length, as after a prefill.

Tolerances (bf16), from what an H100 gave (the summary records each number):
- a replayed graph against the eager forward of the *same* padded inputs runs the same
  kernels on the same shapes: bitwise equal (49 of 49 buckets);
- padding rows, and garbage beyond each session's length (rejected drafts), change no
  real row: bitwise equal;
- verifying k + 1 <= 9 tokens in one step against k + 1 single steps: bitwise equal.
  Speculative answers equal target-only ones at N = 1 (the edge's k = 8) because of
  this; if a new cuBLAS or GPU breaks it, this test says so;
- longer verify steps (17, 33 rows), and a padded step against its exact unpadded
  shape, run GEMMs of another row count, which cuBLAS tiles and reduces in another
  order: across 32 random-weight layers each row's logits moved by up to 5.5%
  (relative L2), and in two runs up to 5 of 17 greedy tokens flipped on near-ties.
  Held to 10%: a padding or indexing bug moves a row by ~100%.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Iterator

import pytest
import torch

from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.buckets import SESSION_BUCKETS, TOKEN_BUCKETS
from tests.support.gpu_compare import Record, recorded

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SLOTS = max(SESSION_BUCKETS)  # 64: every session bucket is captured
SEQ = 160  # positions per slot: room for a start of up to ~120 plus 33 tokens
REL = 0.1  # other GEMM row counts in bf16 (see the module docstring)


@pytest.fixture(scope="module")
def full() -> Iterator[StaticEngine]:
    from tests.support.fullsize import build_full_target

    target = build_full_target("cuda", torch.bfloat16)
    engine = StaticEngine(target, num_slots=SLOTS, max_seq_len=SEQ, use_graphs=True,
                          compile_layers=False)
    engine.warm_up()
    assert sorted(engine.step_graphs) == sorted(
        (b, q) for b in SESSION_BUCKETS for q in TOKEN_BUCKETS)
    gen = torch.Generator(device="cuda").manual_seed(0)
    engine.k_cache.normal_(generator=gen)  # [L, S+1, Hkv, T, D]
    engine.v_cache.normal_(generator=gen)
    for s in range(SLOTS):  # random KV stands in for prefilled sessions
        engine.occupancy.hold(s, SEQ - 1)
    yield engine
    del engine, target
    gc.collect()
    torch.cuda.empty_cache()


def _batch(engine: StaticEngine, slots: list[int], starts: list[int], counts: list[int],
           seed: int) -> StepBatch:
    rng = random.Random(seed)
    vocab = engine.weights.vocab
    ids = torch.tensor([rng.randrange(3, vocab) for _ in range(sum(counts))],
                       device="cuda")  # [N]
    return StepBatch(tuple(slots), tuple(starts), tuple(counts), ids)


def _eager(engine: StaticEngine, batch: StepBatch, bp: int, qp: int) -> torch.Tensor:
    """The step's forward run eagerly at (Bp, Qp): [N, V] float32 logits of the real rows."""
    with torch.inference_mode():
        inp, dest = engine.step_staging.load(batch, bp, qp)
        out = torch.empty(bp * qp, engine.weights.vocab, device="cuda", dtype=engine.dtype)
        return engine._forward(inp, out).index_select(0, dest).float()  # [N, V]


def test_every_production_bucket_replays_the_eager_forward_bitwise(
    full: StaticEngine, record_property: Record,
) -> None:
    rng = random.Random(0)
    not_bitwise = []
    for bp, qp in sorted(full.step_graphs):
        slots = rng.sample(range(SLOTS), bp)
        starts = [rng.randrange(1, SEQ - qp) for _ in slots]
        batch = _batch(full, slots, starts, [qp] * bp, seed=bp * 100 + qp)
        got = full.step(batch)  # [bp*qp, V]: the graph of exactly this bucket
        want = _eager(full, batch, bp, qp)
        d = recorded(record_property, f"bucket_{bp}x{qp}", got, want)
        if not d["bitwise"]:
            not_bitwise.append(((bp, qp), d))
    assert not not_bitwise, not_bitwise


@pytest.mark.parametrize("counts", [(3, 1, 2), (5, 1, 7, 3, 2), (20, 1, 9), (1,) * 37,
                                    tuple(range(1, 34)) + (4,) * 20])
def test_a_padded_step_matches_the_exact_shape_at_full_size(
    full: StaticEngine, counts: tuple[int, ...], record_property: Record,
) -> None:
    """Ragged sessions padded up to a bucket (e.g. 37 -> 64 sessions, 20 -> 33 tokens):
    each real row's logits against the eager step at the exact shape, and against the
    same padded step with other padding and garbage beyond each session's length."""
    rng = random.Random(len(counts))
    slots = rng.sample(range(SLOTS), len(counts))
    starts = [rng.randrange(1, SEQ - 33) for _ in slots]
    batch = _batch(full, slots, starts, list(counts), seed=sum(counts))
    got = full.step(batch)  # [N, V], padded and replayed
    want = _eager(full, batch, len(counts), max(counts))  # unpadded, eager
    d = recorded(record_property, "padded_vs_exact", got, want)
    assert d["max_row_rel"] < REL, d
    # The same padded step again, with other tokens in the padding rows and garbage
    # beyond every session's length: not one bit of a real row moves.
    with torch.inference_mode():
        full.step_staging.ids.random_(3, full.weights.vocab)
        for slot, start, count in zip(slots, starts, counts, strict=True):
            full.k_cache[:, slot, :, start + count :] = 1e4
            full.v_cache[:, slot, :, start + count :] = -1e4
    again = full.step(batch)
    with torch.inference_mode():  # random context again for the tests after this one
        for slot, start, count in zip(slots, starts, counts, strict=True):
            full.k_cache[:, slot, :, start + count :].normal_()
            full.v_cache[:, slot, :, start + count :].normal_()
    recorded(record_property, "padded_with_garbage", again, got)
    assert torch.equal(again, got)


@pytest.mark.parametrize("k", [1, 4, 8, 16, 32])
def test_verifying_k_drafts_matches_single_steps_in_bf16(
    full: StaticEngine, k: int, record_property: Record,
) -> None:
    a, b, start = 10, 11, 100
    full.k_cache[:, b] = full.k_cache[:, a]  # the same context in both slots
    full.v_cache[:, b] = full.v_cache[:, a]
    batch = _batch(full, [a], [start], [k + 1], seed=k)
    together = full.step(batch)  # [k+1, V]
    one_by_one = torch.cat([
        full.step(StepBatch((b,), (start + i,), (1,), batch.token_ids[i : i + 1]))
        for i in range(k + 1)
    ])  # [k+1, V]
    d = recorded(record_property, "verify_vs_single", together, one_by_one)
    if k + 1 <= 9:
        assert d["bitwise"], d
    assert d["max_row_rel"] < REL, d
