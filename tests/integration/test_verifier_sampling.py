"""Sampling (temperature > 0): speculation keeps the target's distribution exactly.

The statistical test drives the pure ``DecodingSession`` with the real ``HFEngine`` and
the ``BatchedSampler`` on the tiny target (no gRPC, for speed), exactly as the scheduler
does: every sampler call is a mixed batch, with a greedy session and another sampling
session beside the one under test. It samples the first two answer tokens under many
seeds with no drafts, with the target's greedy drafts, with plausible wrong drafts, and
with a tree sent once before the prefill (two roots, each with a child, so a rejected
first draft whose correction is the sibling continues down the sibling's branch at the
next step without a new message: docs/trees.md), and compares the empirical joint
distribution of (token 1, token 2) with the exact one computed from the target's logits
(chi-square). The same test is shown to reject a
sampler that resamples rejected drafts from p without removing the draft (the classic
rejection-sampling bug), so it has the power to catch a wrong verifier (Leviathan et al.
2023, Alg. 1; Chen et al. 2023, Alg. 2).

Determinism (same seed, same tokens) is checked over real gRPC.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
import torch

from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.scheduling.sampler import BatchedSampler, SampleSpec, make_generator
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.contract.types import ROOT, DraftNode, DraftTail, GenerationSettings
from eventspec.shared.node.static.batch import StepBatch
from tests.support import cloud_harness as h
from tests.support.sampling import target_probs

TEMPERATURE = 0.1  # the tiny model's logits are flat; this gives p(top) ~ 0.5
TOP_P = 0.95
N_SAMPLES = 500
QUESTION, CLIP_SEED = "What is moving?", 1000
P_MIN = 1e-3  # seeds are fixed, so the outcome is deterministic, not flaky

Pair = tuple[int, int]


@dataclass
class Setup:
    target: TargetModel
    engine: HFEngine
    prompt_ids: list[int]
    prefill_logits: torch.Tensor  # [1, V] of the prompt, prefilled once into slot 0
    p1: torch.Tensor  # [Vt] exact distribution of token 1
    p2: dict[int, torch.Tensor]  # t1 -> [Vt] exact distribution of token 2 given t1

    def joint(self) -> dict[Pair, float]:
        out: dict[Pair, float] = {}
        for t1 in torch.nonzero(self.p1).flatten().tolist():
            for t2 in torch.nonzero(self.p2[t1]).flatten().tolist():
                out[(t1, t2)] = float(self.p1[t1] * self.p2[t1][t2])
        return out


def _probs(target: TargetModel, logits: torch.Tensor) -> torch.Tensor:
    text = logits.reshape(1, -1)[:, : target.text_vocab_size]  # [1, Vt]
    return target_probs(text, TEMPERATURE, TOP_P)[0].double()  # [Vt]


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny forwards on a shared 2-core machine: intra-op threads only add contention
    (measured 13 ms vs 80-270 ms per sample under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def setup(one_thread: None) -> Setup:
    target = build_tiny_random_target(seed=0)
    engine = HFEngine(target, num_slots=1)
    ids = target.build_prompt_ids(QUESTION)
    pix = target.preprocess_frames(h.make_frames(CLIP_SEED))
    logits = engine.prefill([PrefillRequest(0, ids, pixel_values_videos=pix)])  # [1, V]
    p1 = _probs(target, logits)
    p2: dict[int, torch.Tensor] = {}
    for t1 in torch.nonzero(p1).flatten().tolist():
        batch = StepBatch((0,), (len(ids),), (1,), torch.tensor([t1]))
        p2[t1] = _probs(target, engine.step(batch)[0])
    assert float(p1.max()) < 0.9, "token 1 must be uncertain for the test to have power"
    return Setup(target, engine, ids, logits, p1, p2)


def _ranked(p: torch.Tensor, rank: int) -> int:
    order = torch.sort(p, descending=True, stable=True).indices
    return int(order[rank])


def _mixed(sampler: BatchedSampler, rows: torch.Tensor, spec: SampleSpec,
           noise: torch.Tensor, seed: int) -> tuple[int, list[int]]:
    """Run ``spec`` over ``rows`` between a greedy and another sampling session."""
    others = [SampleSpec(2, [3]), SampleSpec(3, [5, 6], 0.7, 0.9, make_generator(seed + 10**6))]
    logits = torch.cat([noise[:2], rows, noise[2:5]])  # [2 + n + 3, V]
    verdict = sampler(logits, [others[0], spec, others[1]])[1]
    return verdict.accepted, verdict.tokens


def _tree(s: Setup) -> tuple[DraftTail, dict[int, int]]:
    """One message of four nodes: the two likeliest first tokens (rank 0 the likelier by
    its draft log-prob, so it is verified first), under rank 0 the second token's rank 0
    and under rank 1 its rank 1 (a branch whose child is often wrong). Returns the tail
    and, per first token, the child drafted under it."""
    r0, r1 = _ranked(s.p1, 0), _ranked(s.p1, 1)
    under = {r0: _ranked(s.p2[r0], 0), r1: _ranked(s.p2[r1], 1)}
    nodes = (DraftNode(0, ROOT, r0, -0.5), DraftNode(1, ROOT, r1, -1.5),
             DraftNode(2, 0, under[r0], -0.7), DraftNode(3, 1, under[r1], -2.0))
    return DraftTail(0, (), nodes=nodes), under


def _sample_pairs(s: Setup, drafts: str, sampler: BatchedSampler,
                  n: int = N_SAMPLES, branches: Counter[str] | None = None) -> Counter[Pair]:
    """Sample (t1, t2) n times; ``drafts``: none, greedy (rank 0), wrong (rank 1) or tree
    (:func:`_tree`, sent once before the prefill). ``branches`` counts, for the tree, the
    second steps that verified the likelier branch, the sibling's, or nothing."""
    rank = {"none": None, "greedy": 0, "wrong": 1, "tree": None}[drafts]
    tree, under = _tree(s)
    counts: Counter[Pair] = Counter()
    noise = torch.randn(5, s.prefill_logits.shape[1], generator=torch.Generator().manual_seed(1))
    for seed in range(n):
        settings = GenerationSettings(max_new_tokens=2, temperature=TEMPERATURE, top_p=TOP_P,
                                      seed=seed)
        session = DecodingSession(
            settings=settings, slot=0, prompt_len=len(s.prompt_ids),
            max_seq_len=s.engine.max_seq_len, eos_token_id=s.target.eos_token_id,
            max_verify_tokens=33, decode=lambda ids: "", speculative=True,
        )
        gen = make_generator(seed)
        if rank is not None:  # a hidden draft for token 1, verified against the prefill row
            assert session.offer_drafts(DraftTail(0, (_ranked(s.p1, rank),)))
        elif drafts == "tree":
            assert session.offer_drafts(tree)
        session.mark_prefilled(0.0)
        first = session.drafts_now()
        a, toks = _mixed(sampler, s.prefill_logits, SampleSpec(1, first, TEMPERATURE, TOP_P, gen),
                         noise, seed)
        session.commit(a, toks, len(first), 0.0)
        if session.finish_reason is None:
            if rank is not None and len(session.committed) == 1:
                t1 = session.committed[0]
                assert session.offer_drafts(DraftTail(1, (_ranked(s.p2[t1], rank),)))
            step = session.step_input()
            if drafts == "tree":  # no new message: the branch under t1, if any
                t1 = session.committed[0]
                assert list(step.drafts) == ([under[t1]] if t1 in under else [])
                if branches is not None:
                    branches["sibling" if t1 == _ranked(s.p1, 1)
                             else "likelier" if t1 in under else "none"] += 1
            else:
                assert len(step.drafts) == (0 if rank is None else 1)
            batch = StepBatch((0,), (step.start_position,), (len(step.tokens),),
                              torch.tensor(step.tokens))
            rows = s.engine.step(batch)  # [1 + drafts, V]
            spec = SampleSpec(len(step.tokens), step.drafts, TEMPERATURE, TOP_P, gen)
            a, toks = _mixed(sampler, rows, spec, noise, seed)
            session.commit(a, toks, len(step.drafts), 0.0)
        assert len(session.committed) == 2, session.committed
        counts[(session.committed[0], session.committed[1])] += 1
    return counts


def _chi_square_p(observed: Counter[object], expected: dict[object, float], n: int) -> float:
    """Pearson chi-square p-value; cells expecting < 5 are pooled into one."""
    stat, rest_o, rest_e, cells = 0.0, 0.0, 0.0, 0
    unexpected = sum(c for k, c in observed.items() if k not in expected)
    assert unexpected == 0, f"{unexpected} samples outside the target's support"
    for key, prob in expected.items():
        e, o = prob * n, observed.get(key, 0)
        if e < 5:
            rest_o, rest_e = rest_o + o, rest_e + e
            continue
        stat += (o - e) ** 2 / e
        cells += 1
    if rest_e > 0:
        stat += (rest_o - rest_e) ** 2 / rest_e
        cells += 1
    dof = max(1, cells - 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def _second(counts: Counter[Pair]) -> Counter[int]:
    out: Counter[int] = Counter()
    for (_, t2), c in counts.items():
        out[t2] += c
    return out


def _second_exact(joint: dict[Pair, float]) -> dict[int, float]:
    out: dict[int, float] = {}
    for (_, t2), p in joint.items():
        out[t2] = out.get(t2, 0.0) + p
    return out


def _tv(counts: Counter[object], exact: dict[object, float], n: int) -> float:
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts.get(k, 0) / n - exact.get(k, 0.0)) for k in keys)


@pytest.mark.parametrize("drafts", ["none", "greedy", "wrong", "tree"])
def test_first_two_tokens_follow_the_target_distribution(setup: Setup, drafts: str) -> None:
    joint = setup.joint()
    assert math.isclose(sum(joint.values()), 1.0, rel_tol=1e-6)
    branches: Counter[str] = Counter()
    counts = _sample_pairs(setup, drafts, BatchedSampler(setup.target.text_vocab_size),
                           branches=branches)
    if drafts == "tree":  # both branches were taken often enough to matter
        assert branches["likelier"] > 50 and branches["sibling"] > 50, branches
    p_joint = _chi_square_p(counts, joint, N_SAMPLES)  # type: ignore[arg-type]
    second, second_exact = _second(counts), _second_exact(joint)
    p_second = _chi_square_p(second, second_exact, N_SAMPLES)  # type: ignore[arg-type]
    tv = _tv(second, second_exact, N_SAMPLES)  # type: ignore[arg-type]
    assert p_joint > P_MIN, f"{drafts}: joint (t1, t2) chi-square p={p_joint:.2e}"
    assert p_second > P_MIN, f"{drafts}: token-2 chi-square p={p_second:.2e}, TV {tv:.3f}"


class _ResamplesFromP(BatchedSampler):
    """The classic bug: on rejection, resample from p itself (x not removed)."""

    @staticmethod
    def _residual(dist: torch.Tensor, draft: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
        return dist


@pytest.mark.parametrize("drafts", ["greedy", "tree"])
def test_the_statistic_catches_a_wrong_rejection_sampler(setup: Setup, drafts: str) -> None:
    counts = _sample_pairs(setup, drafts, _ResamplesFromP(setup.target.text_vocab_size))
    p = _chi_square_p(counts, setup.joint(), N_SAMPLES)  # type: ignore[arg-type]
    assert p < 1e-6, f"a wrong verifier passed the chi-square test (p={p:.2e})"


# -- over gRPC: determinism -----------------------------------------------------------------


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server() -> AsyncIterator[VerifierServer]:
    srv = await h.start_verifier(max_sessions=4)
    yield srv
    await srv.stop(0)


@pytest.mark.asyncio(loop_scope="module")
async def test_same_seed_same_tokens_over_grpc(server: VerifierServer) -> None:
    frames = h.make_frames(1003)

    async def run(seed: int, *, speculative: bool) -> list[int]:
        out = await h.run_generate(server.port, h.open_msg(
            QUESTION, frames, max_new_tokens=24, temperature=0.8, seed=seed,
            speculative=speculative))
        assert all(0 <= t < 512 for t in out.tokens), "sampled a non-text id"
        return out.tokens

    first = await run(7, speculative=False)
    assert await run(7, speculative=False) == first
    # A speculative request that receives no drafts draws the same samples.
    assert await run(7, speculative=True) == first
    others = {tuple(await run(seed, speculative=False)) for seed in (8, 9, 10)}
    assert len(others | {tuple(first)}) > 1, "the seed has no effect on sampling"
