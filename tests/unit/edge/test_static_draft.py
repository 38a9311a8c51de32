"""The static drafter drafts exactly what the HF reference drafter drafts (fp32, CPU).

Two Drafters, one on each backend, walk the same random commit sequences: tails that
grow, get confirmed, or are cut by a diverging Commit (rollbacks), with committed
tokens the draft never saw (refeeds of several tokens at once). After every step the
static backend's logits equal the reference's and every draft token is the same, on the
tiny random draft and on the shipped toy draft.

With ``--draft-quant int8`` / ``int4`` the reference is the HF model running the
dequantised weights, so the check is on PyTorch core's CPU quantised kernels.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventspec.demoworld.tiny_draft import build_tiny_random_draft
from eventspec.edge.drafting.cache import DraftCache, draft_many
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.drafting.static_backend import (
    StaticDraftBackend,
    draft_backend_for,
    draft_engine_name,
    draft_session_buckets,
)
from eventspec.edge.model_dirs import TOY_DRAFT_DIR
from eventspec.shared.contract.errors import FailedPrecondition, InvalidInput
from eventspec.shared.node.static.quant import QuantMode, dequantized_weights
from eventspec.shared.node.static.weights import fuse_llama_weights

QUESTIONS = ["What is moving?", "Which way is the object moving?", "How many objects are there?"]


@pytest.fixture(scope="module", params=["tiny", "toy"])
def pair(request: pytest.FixtureRequest) -> tuple[DraftModel, StaticDraftBackend]:
    """A draft model and a static backend over the same weights (fused in place: the HF
    modules keep computing the same values from views of the fused tensors)."""
    draft = build_tiny_random_draft(seed=3) if request.param == "tiny" else load_draft(
        TOY_DRAFT_DIR)
    return draft, StaticDraftBackend(draft)


def _pixels(draft: DraftModel, seed: int) -> torch.Tensor:
    s = draft.image_size
    return torch.randn(5, 3, s, s, generator=torch.Generator().manual_seed(seed))


def _walk(pair: tuple[DraftModel, StaticDraftBackend], seed: int, steps: int = 12) -> int:
    """One random commit sequence through both drafters; returns the rollbacks seen."""
    draft, static = pair
    rng = random.Random(seed)
    pixels = _pixels(draft, seed)
    question = QUESTIONS[seed % len(QUESTIONS)]
    ref, fast = DraftCache(draft), DraftCache(static)
    ref.prefill(question, pixels)
    fast.prefill(question, pixels)
    assert fast.cached_len() == ref.cached_len()
    committed: list[int] = []
    tail: list[int] = []
    for _ in range(steps):
        for _ in range(rng.randrange(0, 6)):
            context = committed + tail
            token = ref.draft_next(context)
            assert fast.draft_next(context) == token, (seed, context)
            tail.append(token)
        agree = rng.randrange(0, len(tail) + 1)
        commit = tail[:agree]
        for _ in range(rng.choice([0, 1, 1, 3])):  # corrections and unseen committed tokens
            commit.append(rng.randrange(3, draft.text_vocab_size))
        diverged = commit != tail[: len(commit)]
        committed += commit
        tail = [] if diverged else tail[len(commit):]
        context = committed + tail
        token = ref.draft_next(context)
        assert fast.draft_next(context) == token, (seed, context)
        assert ref.last_logits is not None and fast.last_logits is not None
        torch.testing.assert_close(fast.last_logits, ref.last_logits, rtol=1e-4, atol=1e-4)
        assert fast.cached_len() == ref.cached_len()
        tail.append(token)
    assert fast.rollbacks == ref.rollbacks
    return fast.rollbacks


@pytest.mark.parametrize("seed", range(4))
def test_static_drafts_equal_hf_drafts_through_rollbacks_and_refeeds(
    pair: tuple[DraftModel, StaticDraftBackend], seed: int
) -> None:
    assert _walk(pair, seed) > 0


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(min_value=100, max_value=10_000))
def test_static_drafts_equal_hf_drafts_on_random_patterns(
    pair: tuple[DraftModel, StaticDraftBackend], seed: int
) -> None:
    _walk(pair, seed, steps=6)


def test_the_prefill_logits_match_and_the_prompt_cannot_be_rolled_back(
    pair: tuple[DraftModel, StaticDraftBackend],
) -> None:
    draft, static = pair
    pixels = _pixels(draft, 0)
    ref_state, ref_logits = draft.prefill(QUESTIONS[0], pixels)
    state, logits = static.prefill(QUESTIONS[0], pixels)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert static.seq_len(state) == draft.seq_len(ref_state)
    with pytest.raises(InvalidInput, match="rollback"):
        static.rollback(state, state.prompt_len - 1)
    with pytest.raises(InvalidInput, match="out of range"):
        static.step(state, [static.runtime.weights.vocab])
    with pytest.raises(InvalidInput, match="at least one token"):
        static.step(state, [])


def _with_weights_of(ref: DraftModel, static: StaticDraftBackend) -> DraftModel:
    """``ref`` with every decoder matrix replaced by the static backend's dequantised one:
    the HF model computing exactly what the quantised weights stand for."""
    dense = fuse_llama_weights(ref.model.model, ref.model.lm_head)  # views of ref's modules
    deq = dequantized_weights(static.runtime.weights)
    with torch.no_grad():
        for dst, src in zip(dense.layers, deq.layers, strict=True):
            for name in ("wqkv", "wo", "w_gate_up", "w_down"):
                getattr(dst, name).copy_(getattr(src, name))
    return ref


@pytest.fixture(scope="module", params=[("tiny", "int8"), ("tiny", "int4"), ("toy", "int8"),
                                        ("toy", "int4")])
def quant_pair(request: pytest.FixtureRequest) -> tuple[DraftModel, StaticDraftBackend]:
    """A quantised static backend and the HF reference running its dequantised weights."""
    kind, mode = request.param

    def build() -> DraftModel:
        return build_tiny_random_draft(seed=3) if kind == "tiny" else load_draft(TOY_DRAFT_DIR)

    static = StaticDraftBackend(build(), quant=QuantMode.parse(mode), keep_quant_values=True)
    return _with_weights_of(build(), static), static


@pytest.mark.parametrize("seed", range(3))
def test_quantised_drafts_equal_the_dequantised_reference(
    quant_pair: tuple[DraftModel, StaticDraftBackend], seed: int
) -> None:
    """The int8 / int4 kernels (PyTorch core's CPU ones here) draft what the HF model
    with the dequantised weights drafts, through rollbacks and refeeds."""
    _walk(quant_pair, seed, steps=8)


def test_quantised_weights_are_smaller_and_actually_differ_from_the_dense_ones() -> None:
    draft = build_tiny_random_draft(seed=3)
    dense = StaticDraftBackend(draft).runtime.weights
    for mode, share in (("int8", 0.51), ("int4", 0.3)):
        q = StaticDraftBackend(build_tiny_random_draft(seed=3), quant=QuantMode.parse(mode),
                               keep_quant_values=True).runtime.weights
        layer_bytes = sum(int(t.nbytes) for lw in q.layers
                          for t in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down))
        dense_bytes = sum(int(t.nbytes) for lw in dense.layers
                          for t in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down))
        assert layer_bytes < dense_bytes * share, mode
        deq = dequantized_weights(q).layers[0].wqkv
        assert isinstance(deq, torch.Tensor) and isinstance(dense.layers[0].wqkv, torch.Tensor)
        assert not torch.equal(deq, dense.layers[0].wqkv), mode  # really quantised


def test_a_quantised_backend_frees_the_dense_decoder_and_the_hf_path_says_so() -> None:
    draft = build_tiny_random_draft(seed=3)
    backend = draft_backend_for("auto", draft, QuantMode.INT8)  # CPU: static, since quantised
    assert draft_engine_name(backend) == "static int8"
    assert draft.model.model.layers[0].mlp.down_proj.weight.numel() == 0
    ref, fast = DraftCache(draft), DraftCache(backend)
    fast.prefill(QUESTIONS[0], _pixels(draft, 0))
    assert fast.draft_next([]) >= 0
    with pytest.raises(FailedPrecondition, match="quantised to int8"):
        ref.prefill(QUESTIONS[0], _pixels(draft, 0))


def test_quantisation_needs_the_static_drafter() -> None:
    draft = build_tiny_random_draft(seed=3)
    with pytest.raises(InvalidInput, match="--draft-quant int4 needs the static drafter"):
        draft_backend_for("hf", draft, QuantMode.INT4)
    assert draft_engine_name(draft_backend_for("auto", draft)) == "hf"  # CPU, unquantised


@pytest.mark.parametrize("num_slots", [1, 2, 3])
def test_requests_drafting_at_once_never_read_each_others_cache(num_slots: int) -> None:
    """Three requests interleave their drafting on one static drafter, as concurrent Asks
    do on the edge's model thread: each drafts what its own HF reference drafts, with
    fewer slots than requests (evicted slots are rebuilt) and with enough."""
    draft = build_tiny_random_draft(seed=3)
    static = StaticDraftBackend(draft, num_slots=num_slots)
    rng = random.Random(num_slots)
    pairs: list[tuple[DraftCache, DraftCache, list[int]]] = []
    for i in range(3):
        pixels = _pixels(draft, 10 + i)
        ref, fast = DraftCache(draft), DraftCache(static)
        ref.prefill(QUESTIONS[i], pixels)
        fast.prefill(QUESTIONS[i], pixels)
        pairs.append((ref, fast, []))
    for _ in range(30):
        ref, fast, context = pairs[rng.randrange(3)]
        if context and rng.random() < 0.25:  # a Commit that cuts the tail
            del context[rng.randrange(len(context)):]
            context.append(rng.randrange(3, draft.text_vocab_size))
        token = ref.draft_next(context)
        assert fast.draft_next(context) == token
        context.append(token)
    if num_slots < 3:
        assert static.rebuilds > 0
    else:
        assert static.rebuilds == 0


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), num_slots=st.sampled_from([1, 2, 3, 4]))
def test_sessions_drafting_in_one_forward_draft_what_each_drafts_alone(
        seed: int, num_slots: int) -> None:
    """Issue 36: an edge's sessions step together (``draft_many`` over ``step_many``).
    Three sessions' random contexts (drafts, cut tails, corrections) drafted in batches of
    any subset give the tokens and logits each one's HF reference gives alone, with
    slots for all of them (one batched forward) or fewer (taking turns, rebuilt)."""
    draft = build_tiny_random_draft(seed=3)
    static = StaticDraftBackend(draft, num_slots=num_slots)
    widths: list[int] = []  # sessions in each forward of the runtime
    step = static.runtime.step
    static.runtime.step = lambda b: (widths.append(len(b.slots)), step(b))[1]  # type: ignore[method-assign]
    rng = random.Random(seed)
    refs, fasts, contexts = [], [], []
    for i in range(3):
        pixels = _pixels(draft, 20 + i)
        ref, fast = DraftCache(draft), DraftCache(static)
        ref.prefill(QUESTIONS[i], pixels)
        fast.prefill(QUESTIONS[i], pixels)
        refs.append(ref)
        fasts.append(fast)
        contexts.append([])
    together = False  # some round asked two sessions or more at once
    for _ in range(10):
        chosen = [i for i in range(3) if rng.random() < 0.7] or [0]
        together |= len(chosen) > 1
        for i in chosen:
            if contexts[i] and rng.random() < 0.3:  # a Commit that cuts the tail
                del contexts[i][rng.randrange(len(contexts[i])):]
                contexts[i] += [rng.randrange(3, draft.text_vocab_size)
                                for _ in range(rng.choice([1, 2]))]
        got = draft_many([(fasts[i], list(contexts[i])) for i in chosen])
        for i, token in zip(chosen, got, strict=True):
            assert token == refs[i].draft_next(contexts[i]), (seed, i, contexts[i])
            assert fasts[i].last_logits is not None and refs[i].last_logits is not None
            torch.testing.assert_close(fasts[i].last_logits, refs[i].last_logits,
                                       rtol=1e-4, atol=1e-4)
            contexts[i].append(token)
    # One slot: never two sessions in a forward. Slots for all three: the rounds that
    # asked several drafted them together. Two slots for three sessions take turns as
    # the least recently used is rebuilt, so a forward of two is not promised there
    # (seed 500 never had one; it failed before this was said).
    if num_slots == 1:
        assert max(widths) == 1, widths
    elif num_slots >= 3 and together:
        assert max(widths) > 1, widths


def test_draft_steps_capture_a_graph_per_batch_of_sessions() -> None:
    assert draft_session_buckets(1) == (1,)
    assert draft_session_buckets(2) == (1, 2)
    assert draft_session_buckets(3) == (1, 2, 3)
    assert draft_session_buckets(8) == (1, 2, 4, 8)
