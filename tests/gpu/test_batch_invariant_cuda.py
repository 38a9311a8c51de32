"""``--batch-invariant`` on CUDA (``make test-gpu``).

Kernel level, at the 7B shapes with random bf16 data (no model): the Triton GEMM gives a
row the same bits in calls of 1 .. 2,100 rows at any place, with and without the
residual (the rows cover every tile of the table's M buckets, so this is also the check
that the tiles agree with each other); the fixed-split attention gives a query the same
bits alone or among 3, 15 or 63 other sessions, in a 9-query verify step or 9 single
steps, and from the prefill's 16-query pseudo-sessions or a decode step; both stay
close to the float references.

Engine level, on the toy target (fp32 and bf16) with CUDA graphs on: the same bitwise
checks as ``tests/unit/cloud/test_batch_invariant.py`` (a session alone and in padded
and full batches, verify vs single steps, chunked vs whole prefill, a prompt row vs a
step at its position).

All 22 passed on an H200 (torch 2.11, Triton 3.6), run by hand with pytest in the session
that wrote them; no summary JSON was kept.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from eventspec.cloud.engine.base import PrefillChunk, PrefillRequest
from eventspec.cloud.engine.static.build import (
    build_static_engine,
    kv_bytes_per_slot,
    static_kv_plan,
)
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.model_dirs import TOY, model_dir
from eventspec.cloud.target import TargetModel, load_target
from eventspec.shared.node.static.batch import StepBatch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

#: (N, K) of the 7B decoder's fused QKV, wo, fused gate-up, down and Video-LLaVA's LM head.
SHAPES_7B = [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008), (32064, 4096)]
ROWS = [1, 4, 16, 144, 576, 2100]


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


# -- the GEMM ---------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "k"), SHAPES_7B, ids=[f"{n}x{k}" for n, k in SHAPES_7B])
def test_a_gemm_row_has_the_same_bits_in_any_call(n: int, k: int) -> None:
    from eventspec.shared.node.static.invariant_kernels import invariant_mm

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    rows = torch.randn(max(ROWS), k, device="cuda", generator=gen).to(torch.bfloat16)
    res = torch.randn(max(ROWS), n, device="cuda", generator=gen).to(torch.bfloat16)
    x_row = torch.randn(1, k, device="cuda", generator=gen).to(torch.bfloat16)  # [1, K]
    r_row = torch.randn(1, n, device="cuda", generator=gen).to(torch.bfloat16)  # [1, N]
    alone = invariant_mm(x_row, w)  # [1, N]
    alone_res = invariant_mm(x_row, w, accumulate_into=r_row.clone())  # [1, N]
    for m in ROWS:
        for at in sorted({0, m // 2, m - 1}):
            x = rows[:m].clone()  # [M, K]
            x[at] = x_row[0]
            y = invariant_mm(x, w)  # [M, N]
            assert torch.equal(y[at : at + 1], alone), (m, at)
            h = res[:m].clone()  # [M, N]
            h[at] = r_row[0]
            invariant_mm(x, w, accumulate_into=h)
            assert torch.equal(h[at : at + 1], alone_res), (m, at, "residual")
            out = torch.empty_like(y)
            assert torch.equal(invariant_mm(x, w, out=out), y)
    x = rows.clone()
    want = x.float() @ w.float().t()  # [2100, N]
    assert _rel_err(invariant_mm(x, w), want) < 1e-2
    h = res.clone()
    assert _rel_err(invariant_mm(x, w, accumulate_into=h), res.float() + want) < 1e-2


# -- attention ---------------------------------------------------------------------------

HEADS, KV_HEADS, HEAD_DIM, T, SLOTS = 32, 32, 128, 2304, 65
CONTEXT = 2100  # the session under test's cached positions


@pytest.fixture(scope="module")
def cache() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """[S, Hkv, T, D] bf16 K and V, random in every position (past any length too)."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    shape = (SLOTS, KV_HEADS, T, HEAD_DIM)
    k = torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    v = torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    yield k, v
    del k, v
    torch.cuda.empty_cache()


def _step(cache: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, slots: list[int],
          starts: list[int]) -> torch.Tensor:
    """Attention of [B, Q, H, D] queries, session b in slots[b] from starts[b]."""
    from eventspec.shared.node.static.invariant_kernels import fixed_split_attention

    t = torch.tensor
    st = t(starts, device="cuda")
    lens = st + q.shape[1]
    return fixed_split_attention(q, cache[0], cache[1], t(slots, device="cuda"), st, lens)


def _reference(cache: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, slot: int,
               start: int) -> torch.Tensor:
    """Dense masked attention in float32 of one session's [1, Q, H, D] queries."""
    from eventspec.shared.node.static.attention import reference_attention

    k = cache[0][slot : slot + 1].float()  # [1, Hkv, T, D]
    v = cache[1][slot : slot + 1].float()
    one = torch.tensor([0], device="cuda")
    st = torch.tensor([start], device="cuda")
    return reference_attention(q.float(), k, v, one, st, st + q.shape[1])


@pytest.mark.parametrize("nq", [1, 9])
def test_a_query_has_the_same_bits_alone_and_among_others(
        cache: tuple[torch.Tensor, torch.Tensor], nq: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(nq)
    q_me = torch.randn(1, nq, HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    me = 7
    alone = _step(cache, q_me, [me], [CONTEXT])  # [1, Q, H, D]
    for b in (4, 16, 64):
        others = [s for s in range(SLOTS) if s != me][: b - 1]
        starts = torch.randint(1, T - nq, (b,), generator=torch.Generator().manual_seed(b))
        for at in sorted({0, b // 2, b - 1}):
            slots = [*others[:at], me, *others[at:]]
            st = starts.tolist()
            st[at] = CONTEXT
            q = torch.randn(b, nq, HEADS, HEAD_DIM, device="cuda", generator=gen)
            q = q.to(torch.bfloat16)
            q[at] = q_me[0]
            assert torch.equal(_step(cache, q, slots, st)[at], alone[0]), (b, at)
    assert _rel_err(alone, _reference(cache, q_me, me, CONTEXT)) < 1e-2


@pytest.mark.parametrize("nq", [9, 16, 33])
def test_a_verify_step_equals_single_steps(cache: tuple[torch.Tensor, torch.Tensor],
                                           nq: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(100 + nq)
    q = torch.randn(1, nq, HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    verify = _step(cache, q, [5], [CONTEXT])  # [1, Q, H, D]
    for j in range(nq):
        single = _step(cache, q[:, j : j + 1].contiguous(), [5], [CONTEXT + j])
        assert torch.equal(single[0, 0], verify[0, j]), j


@pytest.mark.parametrize(("start", "length"), [(0, 37), (1800, 300), (64, 2036)])
def test_prefill_rows_equal_decode_rows(cache: tuple[torch.Tensor, torch.Tensor],
                                        start: int, length: int) -> None:
    from eventspec.shared.node.static.invariant_kernels import prefill_fixed_split_attention
    from eventspec.shared.node.static.invariant_tiles import prefill_tiles

    gen = torch.Generator(device="cuda").manual_seed(start + length)
    q = torch.randn(length, HEADS, HEAD_DIM, device="cuda", generator=gen)
    q = q.to(torch.bfloat16)  # [L, H, D]
    slot = 9
    tiles = prefill_tiles([slot], [start], [length], torch.device("cuda"))
    rows = prefill_fixed_split_attention(q, cache[0], cache[1], tiles)  # [L, H, D]
    # Every row as a one-token decode step at its position, all in one batch ...
    decode = _step(cache, q[:, None], [slot] * length, list(range(start, start + length)))
    assert torch.equal(rows, decode[:, 0])
    # ... and a few as the only session of their step.
    for j in sorted({0, length // 2, length - 1}):
        alone = _step(cache, q[j : j + 1, None].contiguous(), [slot], [start + j])
        assert torch.equal(rows[j], alone[0, 0]), j
    assert _rel_err(rows, _reference(cache, q[None], slot, start)[0]) < 1e-2


def test_prefill_pieces_in_one_call_equal_each_alone(
        cache: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Several pieces (different slots and starts) in one prefill call: each piece's rows
    are the bits it gets alone."""
    from eventspec.shared.node.static.invariant_kernels import prefill_fixed_split_attention
    from eventspec.shared.node.static.invariant_tiles import prefill_tiles

    pieces = [(11, 0, 45), (12, 700, 16), (13, 1500, 130)]
    gen = torch.Generator(device="cuda").manual_seed(3)
    qs = [torch.randn(n, HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
          for _, _, n in pieces]
    tiles = prefill_tiles([s for s, _, _ in pieces], [st for _, st, _ in pieces],
                          [n for _, _, n in pieces], torch.device("cuda"))
    together = prefill_fixed_split_attention(torch.cat(qs), cache[0], cache[1], tiles)
    off = 0
    for (slot, start, n), q in zip(pieces, qs, strict=True):
        one = prefill_tiles([slot], [start], [n], torch.device("cuda"))
        alone = prefill_fixed_split_attention(q, cache[0], cache[1], one)
        assert torch.equal(together[off : off + n], alone), slot
        off += n


# -- the engine on the toy target ---------------------------------------------------------

ENGINE_SLOTS = 65
DRAFTS = [11, 5, 7, 3, 9, 2, 8, 4]


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[TargetModel, StaticEngine, int]]:
    dtype = request.param
    target = load_target(model_dir(TOY), device="cuda", dtype=dtype)
    kv = static_kv_plan(target,
                        kv_cache_bytes=(ENGINE_SLOTS + 1) * kv_bytes_per_slot(target, 512),
                        max_seq_len=512)  # fmt: skip
    eng = build_static_engine(target, kv, batch_invariant=True)
    assert eng.invariant_kernels and eng.use_graphs and eng.step_graphs, "the fast path"
    g = target.geometry
    ids = target.build_prompt_ids("What is moving?")
    for slot in range(ENGINE_SLOTS - 1):  # a different clip in every slot
        pix = torch.randn((1, g.num_frames, 3, g.image_size, g.image_size),
                          generator=torch.Generator().manual_seed(slot)).to("cuda", dtype)
        eng.prefill([PrefillRequest(slot, ids, pixel_values_videos=pix)])
    yield target, eng, len(ids)
    del eng
    torch.cuda.empty_cache()


def _engine_step(engine: StaticEngine, slots: list[int], start: int,
                 tokens: list[int]) -> torch.Tensor:
    batch = StepBatch(tuple(slots), (start,) * len(slots), (len(tokens),) * len(slots),
                      torch.tensor(tokens * len(slots), device="cuda"))
    return engine.step(batch)  # [B k, V]


@pytest.mark.parametrize("k", [0, 8])
def test_a_session_gets_the_same_bits_in_any_batch_on_cuda(
        engine: tuple[TargetModel, StaticEngine, int], k: int) -> None:
    _, eng, n = engine
    tokens = [7, *DRAFTS[:k]]
    alone = _engine_step(eng, [3], n, tokens)
    # B = 3 (padded to the bucket of 4), 4 first and last, 16, 64.
    for batch in ([0, 3, 1], [3, 0, 1, 2], [0, 1, 2, 3], list(range(16)), list(range(64))):
        at = batch.index(3) * len(tokens)
        together = _engine_step(eng, batch, n, tokens)[at : at + len(tokens)]
        assert torch.equal(alone, together), (k, len(batch), batch.index(3))


def test_a_verify_step_equals_single_token_steps_on_cuda(
        engine: tuple[TargetModel, StaticEngine, int]) -> None:
    _, eng, n = engine
    tokens = [7, *DRAFTS]
    verify = _engine_step(eng, [5], n, tokens)
    singles = torch.cat([_engine_step(eng, [5], n + i, [t]) for i, t in enumerate(tokens)])
    assert torch.equal(verify, singles)


def test_a_chunked_prefill_and_a_step_give_a_whole_prefills_bits_on_cuda(
        engine: tuple[TargetModel, StaticEngine, int]) -> None:
    target, eng, n = engine
    g = target.geometry
    slot = ENGINE_SLOTS - 1
    pix = torch.randn((1, g.num_frames, 3, g.image_size, g.image_size),
                      generator=torch.Generator().manual_seed(99)).to("cuda", target.dtype)
    req = PrefillRequest(slot, target.build_prompt_ids("What is moving?"),
                         pixel_values_videos=pix)
    whole = eng.prefill([req])[0]
    embeds = eng.prompt_embeds(req)
    for size in (7, 16, 40):
        eng.free(slot)
        last = None
        for lo in range(0, n, size):
            last = eng.prefill_chunks([PrefillChunk(slot, lo, embeds[lo : lo + size])])[0]
        assert last is not None and torch.equal(last, whole), size
    eng.free(slot)
    eng.prefill_chunks([PrefillChunk(slot, 0, embeds[: n - 1])])
    step = _engine_step(eng, [slot], n - 1, [int(req.input_ids[-1])])[0]
    assert torch.equal(step, whole)
    eng.free(slot)
