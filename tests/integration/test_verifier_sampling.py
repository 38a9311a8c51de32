"""Sampling (temperature > 0): speculation keeps the target's distribution exactly.

The statistical test drives ``DecodingSession`` over the real ``HFEngine`` on the tiny
target (no gRPC, for speed): it samples the first two answer tokens under many seeds
with no drafts, with the target's greedy drafts and with plausible wrong drafts, and
compares the empirical joint distribution of (token 1, token 2) with the exact one
computed from the target's logits (chi-square). The same test is shown to reject a
verifier that resamples rejected drafts from p without removing the draft (the classic
rejection-sampling bug), so it has the power to catch a wrong verifier (Leviathan et al.
2023, Alg. 1; Chen et al. 2023, Alg. 2).

Determinism (same seed, same tokens) is checked over real gRPC.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import pytest
import pytest_asyncio
import torch

import cloud.decoding
from cloud.decoding import DecodingSession
from cloud.engine.base import EngineState
from cloud.engine.hf import HFEngine
from cloud.server import VerifierServer
from cloud.target import TargetModel
from cloud.verify import VerifyResult, mask_non_text, probs_from_logits, sample
from shared.demoworld.tiny_target import build_tiny_random_target
from shared.types import DraftTail, GenerationSettings
from tests.integration import cloud_harness as h

TEMPERATURE = 0.1  # the tiny model's logits are flat; this gives p(top) ~ 0.5
TOP_P = 0.95
N_SAMPLES = 500
QUESTION, CLIP_SEED = "What is moving?", 1000
P_MIN = 1e-3  # seeds are fixed, so the outcome is deterministic, not flaky

Pair = tuple[int, int]


class _SharedPrefill:
    """An engine whose prefill is computed once and replayed (rolled back) per sample."""

    def __init__(self, engine: HFEngine, state: EngineState, logits: torch.Tensor, n: int):
        self.engine, self.state, self.logits, self.prompt_len = engine, state, logits, n

    def prefill(self, input_ids: Sequence[int], **_: object) -> tuple[EngineState, torch.Tensor]:
        assert len(input_ids) == self.prompt_len
        self.engine.rollback(self.state, self.prompt_len)
        return self.state, self.logits.clone()

    def step(self, state: EngineState, tokens: Sequence[int]) -> torch.Tensor:
        return self.engine.step(state, tokens)

    def rollback(self, state: EngineState, keep_len: int) -> None:
        self.engine.rollback(state, keep_len)

    def release(self, state: EngineState) -> None:  # shared: never released here
        pass

    def seq_len(self, state: EngineState) -> int:
        return self.engine.seq_len(state)


@dataclass
class Setup:
    target: TargetModel
    engine: _SharedPrefill
    prompt_ids: list[int]
    p1: torch.Tensor  # [V] exact distribution of token 1
    p2: dict[int, torch.Tensor]  # t1 -> [V] exact distribution of token 2 given t1

    def joint(self) -> dict[Pair, float]:
        out: dict[Pair, float] = {}
        for t1 in torch.nonzero(self.p1).flatten().tolist():
            for t2 in torch.nonzero(self.p2[t1]).flatten().tolist():
                out[(t1, t2)] = float(self.p1[t1] * self.p2[t1][t2])
        return out


def _probs(target: TargetModel, logits: torch.Tensor) -> torch.Tensor:
    rows = mask_non_text(logits.reshape(1, -1), target.text_vocab_size)  # [1, V]
    return probs_from_logits(rows, TEMPERATURE, TOP_P)[0].double()  # [V]


@pytest.fixture(scope="module")
def setup() -> Setup:
    target = build_tiny_random_target(seed=0)
    engine = HFEngine(target)
    ids = target.build_prompt_ids(QUESTION)
    pix = target.preprocess_frames(h.make_frames(CLIP_SEED))
    state, logits = engine.prefill(ids, pixel_values_videos=pix)
    p1 = _probs(target, logits)
    p2: dict[int, torch.Tensor] = {}
    for t1 in torch.nonzero(p1).flatten().tolist():
        engine.rollback(state, len(ids))
        p2[t1] = _probs(target, engine.step(state, [t1])[0])
    assert float(p1.max()) < 0.9, "token 1 must be uncertain for the test to have power"
    return Setup(target, _SharedPrefill(engine, state, logits, len(ids)), ids, p1, p2)


def _ranked(p: torch.Tensor, rank: int) -> int:
    order = torch.sort(p, descending=True, stable=True).indices
    return int(order[rank])


def _sample_pairs(s: Setup, drafts: str, n: int = N_SAMPLES) -> Counter[Pair]:
    """Sample (t1, t2) n times; ``drafts``: none, greedy (rank 0) or wrong (rank 1)."""
    rank = {"none": None, "greedy": 0, "wrong": 1}[drafts]
    counts: Counter[Pair] = Counter()
    for seed in range(n):
        session = DecodingSession(
            settings=GenerationSettings(max_new_tokens=2, temperature=TEMPERATURE, top_p=TOP_P,
                                        seed=seed),
            text_vocab_size=s.target.text_vocab_size,
            eos_token_id=s.target.eos_token_id,
            max_draft_tokens=128,
            max_verify_tokens=33,
            decode=lambda ids: "",
            speculative=True,
        )
        if rank is not None:  # a hidden draft for token 1, verified against the prefill row
            assert session.offer_drafts(DraftTail(0, (_ranked(s.p1, rank),)))
        session.run_prefill(s.engine, s.prompt_ids, pixel_values_videos=torch.empty(0))
        session.mark_prefill_done()
        for _ in range(2):
            if session.finish_reason is not None:
                break
            if rank is not None and len(session.committed) == 1:
                t1 = session.committed[0]
                assert session.offer_drafts(DraftTail(1, (_ranked(s.p2[t1], rank),)))
            drafts_now = session.drafts_for_step()
            assert len(drafts_now) == (0 if rank is None else 1)
            session.apply(session.run_step(s.engine, drafts_now))
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


@pytest.mark.parametrize("drafts", ["none", "greedy", "wrong"])
def test_first_two_tokens_follow_the_target_distribution(setup: Setup, drafts: str) -> None:
    joint = setup.joint()
    assert math.isclose(sum(joint.values()), 1.0, rel_tol=1e-6)
    counts = _sample_pairs(setup, drafts)
    p_joint = _chi_square_p(counts, joint, N_SAMPLES)  # type: ignore[arg-type]
    second, second_exact = _second(counts), _second_exact(joint)
    p_second = _chi_square_p(second, second_exact, N_SAMPLES)  # type: ignore[arg-type]
    tv = _tv(second, second_exact, N_SAMPLES)  # type: ignore[arg-type]
    assert p_joint > P_MIN, f"{drafts}: joint (t1, t2) chi-square p={p_joint:.2e}"
    assert p_second > P_MIN, f"{drafts}: token-2 chi-square p={p_second:.2e}, TV {tv:.3f}"


def _verify_without_removing_the_draft(
    logits: torch.Tensor, drafts: Sequence[int], temperature: float, top_p: float,
    generator: torch.Generator,
) -> VerifyResult:
    """The classic bug: on rejection, resample from p itself (x not removed)."""
    probs = probs_from_logits(logits, temperature, top_p)  # [n, V]
    tokens: list[int] = []
    for i, x in enumerate(int(d) for d in drafts):
        if float(torch.rand((), generator=generator)) < float(probs[i, x]):
            tokens.append(x)
            continue
        tokens.append(sample(probs[i], generator))
        return VerifyResult(accepted=i, tokens=tokens)
    if probs.shape[0] > len(drafts):
        tokens.append(sample(probs[len(drafts)], generator))
    return VerifyResult(accepted=len(drafts), tokens=tokens)


def test_the_statistic_catches_a_wrong_rejection_sampler(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cloud.decoding, "verify_sampling", _verify_without_removing_the_draft)
    counts = _sample_pairs(setup, "greedy")
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
