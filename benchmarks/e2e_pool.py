"""The end-to-end benchmark's questions and Asks (``benchmarks/bench_e2e.py``): a pool of
unique toy-world questions over consecutive scenes, the speculative / target-only pairs
of the latency phase, the answers the oracle drafts from, and the uplink's Asks."""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract.types import (
    UPLOAD_STAGE,
    AskSpec,
    FeatureMode,
    FinalEvent,
    GenerationSettings,
    Mode,
)
from eventspec.shared.toyworld.qa import all_questions
from eventspec.shared.toyworld.scenes import EVAL_SEED_MIN, sample_scene

SEED0 = EVAL_SEED_MIN + 9000
SCENE_US = 1_000_000


@dataclass(frozen=True)
class Question:
    """One request of the pool: the text (unique: the oracle's key) and its scene."""

    text: str
    scene: int

    def spec(self, mode: Mode, max_new: int,
             feature_mode: FeatureMode = FeatureMode.FRAMES) -> AskSpec:
        return AskSpec(self.text, mode=mode, feature_mode=feature_mode,
                       generation=GenerationSettings(max_new_tokens=max_new),
                       latest_ms=None, t0_us=self.scene * SCENE_US,
                       t1_us=(self.scene + 1) * SCENE_US)


def question_pool(n: int) -> list[Question]:
    """``n`` toy-world questions over consecutive scenes, made unique by a suffix."""
    out: list[Question] = []
    seen: set[str] = set()
    scene = 0
    while len(out) < n:
        for qa in all_questions(sample_scene(SEED0 + scene)):
            text = qa.question
            k = 1
            while text in seen:
                k += 1
                text = f"{qa.question} ({k})"
            seen.add(text)
            out.append(Question(text, scene))
            if len(out) == n:
                break
        scene += 1
    return out


def scenes_needed(pool: Sequence[Question], scenes: int) -> int:
    """The toy scenes an edge's source must play so every question's clip lies in it
    (at least ``scenes``): a 64-question pool spans more than the default 8."""
    return max([scenes, *(q.scene + 1 for q in pool)])


async def timed(client: EdgeClient, spec: AskSpec) -> tuple[FinalEvent, float]:
    """The final event of one Ask and its client wall time in ms."""
    t0 = time.perf_counter()
    final = await client.ask_final(spec)
    return final, (time.perf_counter() - t0) * 1e3


def speculative_first(question: str) -> bool:
    """The seeded coin that orders a request's two modes (the same on every run)."""
    return hashlib.blake2b(question.encode(), digest_size=1).digest()[0] % 2 == 0


def pair_orders(question: str, repeats: int) -> list[bool]:
    """Whether the speculative run goes first in each of a request's ``repeats`` rounds:
    the question's coin for the first, then alternating, so a drift of the machine during
    the pair weighs on both modes alike."""
    first = speculative_first(question)
    return [first != bool(r % 2) for r in range(max(1, repeats))]


def pair_row(question: str, spec_runs: Sequence[tuple[FinalEvent, float]],
             base_runs: Sequence[tuple[FinalEvent, float]]) -> dict[str, Any]:
    """One request's row from its rounds: each mode's median time (one round: its time),
    the speedup of those medians, and the last round's answers and statistics."""
    spec, _ = spec_runs[-1]
    base, _ = base_runs[-1]
    spec_ms = statistics.median(ms for _, ms in spec_runs)
    base_ms = statistics.median(ms for _, ms in base_runs)
    s = spec.stats
    return {
        "question": question, "spec_ms": spec_ms, "target_ms": base_ms,
        "speedup": base_ms / spec_ms, "tokens": len(spec.token_ids),
        "spec_ms_runs": [ms for _, ms in spec_runs],
        "target_ms_runs": [ms for _, ms in base_runs],
        "same_across_runs": len({tuple(f.token_ids) for f, _ in (*spec_runs, *base_runs)}) == 1,
        "spec_ids": list(spec.token_ids), "target_ids": list(base.token_ids),
        "drafted": s.drafted, "accepted": s.accepted, "steps": s.target_steps,
        "target_only_steps": base.stats.target_steps,
        "hidden_drafted": s.hidden_drafted, "hidden_accepted": s.hidden_accepted,
        "ttft_ms": s.ttft_ms, "target_ttft_ms": base.stats.ttft_ms,
        "speculated": bool(spec.plan and spec.plan.speculate),
        "lookahead": spec.plan.lookahead_tokens if spec.plan else 0,
        "hidden_budget": spec.plan.hidden_draft_budget if spec.plan else 0,
        "plan_prefill_ms": spec.plan.predicted_prefill_ms if spec.plan else 0.0,
    }


async def ask_pairs(address: str, questions: Sequence[Question], max_new: int,
                    repeats: int = 1) -> list[dict[str, Any]]:
    """Each question speculative and target-only on one edge, ``repeats`` rounds back to
    back (:func:`pair_orders`): one row per question (:func:`pair_row`).

    Which mode goes first is drawn per request from the question's text (a seeded coin,
    independent of the edge and the client), so that with several clients both modes
    meet the same load: with speculative always first, the clients' speculative requests
    arrived together and queued behind each other's prefills while their target-only
    requests came staggered (α = 0, 4 clients: 0.87x, although nothing was drafted);
    and an order tied to the edge made 64 clients 16 units (issue 36). Several rounds
    give each mode a median time: one run each spread 44 identical requests (speculation
    planned off, RTT 70 ms) by more than 3% both ways in 15 of them."""
    rows = []
    async with EdgeClient(address, timeout_s=300) as edge:
        for q in questions:
            spec_runs: list[tuple[FinalEvent, float]] = []
            base_runs: list[tuple[FinalEvent, float]] = []
            for spec_first in pair_orders(q.text, repeats):
                for mode in (Mode.SPECULATIVE, Mode.TARGET_ONLY) if spec_first else (
                        Mode.TARGET_ONLY, Mode.SPECULATIVE):
                    run = await timed(edge, q.spec(mode, max_new))
                    (spec_runs if mode is Mode.SPECULATIVE else base_runs).append(run)
            rows.append(pair_row(q.text, spec_runs, base_runs))
    return rows


async def precompute_answers(address: str, pool: Sequence[Question], max_new: int,
                             concurrency: int) -> dict[str, list[int]]:
    """Every question of the pool target-only, ``concurrency`` at a time (1: each alone,
    the N = 1 answers; more is faster for long answers, and on a GPU whose bf16 kernels
    are not batch-invariant the answers then carry that load's rounding)."""
    gate = asyncio.Semaphore(concurrency)
    async with EdgeClient(address, timeout_s=600) as client:
        async def one(q: Question) -> tuple[str, list[int]]:
            async with gate:
                final = await client.ask_final(q.spec(Mode.TARGET_ONLY, max_new))
            return q.text, list(final.token_ids)

        return dict(await asyncio.gather(*(one(q) for q in pool)))


async def uplink_rows(address: str, question: Question, max_new: int, rate_mbit: float
                      ) -> list[dict[str, Any]]:
    """One speculative Ask per feature mode (frames; aligned features; auto) through an
    uplink of ``rate_mbit``: TTFT, the bytes sent, their time on the wire at that rate,
    and what the plan said of the aligned path."""
    rows = []
    async with EdgeClient(address, timeout_s=300) as client:
        for mode in (FeatureMode.FRAMES, FeatureMode.ALIGNED, FeatureMode.AUTO):
            try:
                final, total_ms = await timed(client,
                                              question.spec(Mode.SPECULATIVE, max_new, mode))
            except AskError as exc:  # e.g. aligned features from an edge with no adapter
                if exc.code != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                rows.append({"rate_mbit": rate_mbit, "requested": mode.name.lower(),
                             "error": str(exc)})
                continue
            s = final.stats
            upload_ms = s.stage_ms.get("edge_upload", 0.0)
            cloud_ms = s.stage_ms.get(UPLOAD_STAGE, 0.0)
            rows.append({
                "rate_mbit": rate_mbit, "requested": mode.name.lower(),
                "feature_mode": final.feature_mode.name.lower() if final.feature_mode else None,
                "ttft_ms": s.ttft_ms, "total_ms": total_ms, "uplink_bytes": s.uplink_bytes,
                "wire_ms_at_rate": s.uplink_bytes * 8 / (rate_mbit * 1e6) * 1e3,
                # The edge's clock (Open sent to upload done and first reply): it times
                # buffers, so its rate is not the link's (it no longer feeds the estimate).
                "edge_upload_ms": upload_ms,
                "edge_sees_mbit": (s.uplink_bytes * 8 / (upload_ms * 1e3)
                                   if upload_ms > 0 else None),
                # The cloud's timing of aligned features (header to last chunk), which
                # feeds the edge's uplink estimate: the rate that estimate sees.
                "cloud_upload_ms": cloud_ms or None,
                "estimate_sample_mbit": (s.uplink_bytes * 8 / (cloud_ms * 1e3)
                                         if cloud_ms > 0 else None),
                "aligned_fits_uplink": bool(final.plan and final.plan.aligned_fits_uplink),
                "plan_prefill_ms": final.plan.predicted_prefill_ms if final.plan else None,
            })
    return rows
