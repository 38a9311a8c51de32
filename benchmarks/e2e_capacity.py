"""The end-to-end benchmark's capacity phase (``benchmarks/bench_e2e.py``): N clients
ask at once in one mode, then in the other, and the cloud's goodput is compared.

The latency phase asks each question speculative and target-only back to back, so its
wall time mixes both modes and says nothing of capacity. Here every client of a point
asks its questions in one mode only, all clients at the same time; goodput is the
tokens answered over the wall time from the first Ask to the last answer. A point is
repeated (``--capacity-repeats``), the order of the modes drawn at random each time, so
neither always meets a cold or a warm cloud, and the median ratio is reported.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.e2e_pool import Question, timed
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.contract.types import Mode

#: Runs one mode at a point: (edges, questions per client, mode, max new tokens) -> run.
ModeRunner = Callable[[Sequence[str], Sequence[Sequence[Question]], Mode, int],
                      Awaitable[dict[str, Any]]]


async def _client_asks(address: str, questions: Sequence[Question], mode: Mode,
                       max_new: int) -> list[dict[str, Any]]:
    rows = []
    async with EdgeClient(address, timeout_s=600) as edge:
        for q in questions:
            final, ms = await timed(edge, q.spec(mode, max_new))
            s = final.stats
            rows.append({"question": q.text, "ms": ms, "tokens": len(final.token_ids),
                         "ids": list(final.token_ids), "steps": s.target_steps,
                         "ttft_ms": s.ttft_ms, "drafted": s.drafted,
                         "accepted": s.accepted, "offered": s.drafts_on_offer,
                         "dry_steps": s.dry_steps, "nodes_sent": s.tree_nodes_sent,
                         "nodes_pruned": s.tree_nodes_pruned,
                         "draft_forward_ms": s.draft_forward_ms,
                         "plans_sent": s.plans_sent, "sat_out": s.steps_sat_out})
    return rows


async def one_mode(edges: Sequence[str], questions: Sequence[Sequence[Question]],
                   mode: Mode, max_new: int) -> dict[str, Any]:
    """Client ``i`` asks ``questions[i]`` through ``edges[i % len(edges)]``, all clients
    at once, every Ask in ``mode``: goodput, latency percentiles, tokens per step."""
    t0 = time.perf_counter()
    per_client = await asyncio.gather(*(
        _client_asks(edges[i % len(edges)], qs, mode, max_new)
        for i, qs in enumerate(questions)))
    wall_s = time.perf_counter() - t0
    rows = [r for rs in per_client for r in rs]
    ms = np.array([r["ms"] for r in rows])
    tokens = sum(r["tokens"] for r in rows)
    steps = sum(r["steps"] for r in rows)
    drafted = sum(r["drafted"] for r in rows)
    return {
        "mode": mode.name.lower(), "requests": len(rows), "wall_s": wall_s,
        "goodput_tok_s": tokens / wall_s, "tokens": tokens,
        "latency_ms_p50": float(np.median(ms)), "latency_ms_p99": float(np.quantile(ms, 0.99)),
        "ttft_ms_p50": statistics.median(r["ttft_ms"] for r in rows),
        # The stats count the prefill as a step.
        "tokens_per_step": ((tokens - len(rows)) / (steps - len(rows))
                            if steps > len(rows) else None),
        "acceptance": sum(r["accepted"] for r in rows) / drafted if drafted else None,
        # What the edges kept ahead of the cloud: drafts on offer per verify step (before
        # the width rule), the share of steps with none, tree nodes sent and pruned per
        # committed token, and the edges' drafting time per verify step.
        **offer_stats(rows, tokens, steps - len(rows)),
        "answers": {r["question"]: r["ids"] for r in rows},
    }


def offer_stats(rows: Sequence[dict[str, Any]], tokens: int, verify_steps: int
                ) -> dict[str, float | None]:
    """Per-request counters summed into rates (None where nothing was counted)."""
    if verify_steps <= 0:
        return {"offered_per_step": None, "dry_step_share": None,
                "nodes_sent_per_token": None, "nodes_pruned_per_token": None,
                "draft_ms_per_step": None, "replans_per_request": None,
                "sat_out_share": None}
    sent = sum(r.get("nodes_sent", 0) for r in rows)
    return {
        "offered_per_step": sum(r.get("offered", 0) for r in rows) / verify_steps,
        "dry_step_share": sum(r.get("dry_steps", 0) for r in rows) / verify_steps,
        "nodes_sent_per_token": sent / tokens if sent and tokens else None,
        "nodes_pruned_per_token": (sum(r.get("nodes_pruned", 0) for r in rows) / tokens
                                   if sent and tokens else None),
        "draft_ms_per_step": sum(r.get("draft_forward_ms", 0.0) for r in rows) / verify_steps,
        "replans_per_request": sum(r.get("plans_sent", 0) for r in rows) / max(1, len(rows)),
        # Steps a session sat out, against the steps it ran (--sit-out).
        "sat_out_share": sum(r.get("sat_out", 0) for r in rows) / verify_steps,
    }


async def capacity_point(edges: Sequence[str], questions: Sequence[Sequence[Question]],
                         max_new: int, *, alpha: float, rtt_ms: float, repeats: int = 3,
                         rng: random.Random | None = None,
                         run_mode: ModeRunner | None = None) -> dict[str, Any]:
    """One capacity point: both modes in turn with the same clients and questions,
    ``repeats`` times, the order of the two modes drawn at random each time (issue 36:
    a fixed order tied to the edges made 64 clients 16 units). ``goodput_ratio`` is the
    median of the repeats' ratios; ``speculative`` and ``target_only`` are the runs of
    the repeat with that median ratio (the lower middle for an even count)."""
    rng = rng if rng is not None else random.Random(0)
    run_mode = run_mode if run_mode is not None else one_mode
    rounds = []
    for _ in range(max(1, repeats)):
        order = [Mode.SPECULATIVE, Mode.TARGET_ONLY]
        rng.shuffle(order)
        runs = {}
        for mode in order:
            runs[mode] = await run_mode(edges, questions, mode, max_new)
        rounds.append((order[0], runs[Mode.SPECULATIVE], runs[Mode.TARGET_ONLY]))
    ratios = [spec["goodput_tok_s"] / base["goodput_tok_s"] for _, spec, base in rounds]
    middle = sorted(range(len(ratios)), key=lambda i: ratios[i])[(len(ratios) - 1) // 2]
    _, spec, base = rounds[middle]
    same = [s["answers"].get(q) == ids for _, s, b in rounds for q, ids in b["answers"].items()]
    for _, s, b in rounds:
        s.pop("answers", None)
        b.pop("answers", None)
    return {
        "alpha": alpha, "rtt_ms": rtt_ms, "clients": len(questions),
        "edges": min(len(edges), len(questions)), "max_new_tokens": max_new,
        "speculative": spec, "target_only": base,
        "goodput_ratio": ratios[middle],
        "repeats": [{"first": first.name.lower(), "goodput_ratio": r,
                     "speculative_tok_s": s["goodput_tok_s"],
                     "target_only_tok_s": b["goodput_tok_s"],
                     "tokens_per_step": s["tokens_per_step"]}
                    for (first, s, b), r in zip(rounds, ratios, strict=True)],
        "identical_share": float(np.mean(same)) if same else None,
    }


def capacity_table(points: Sequence[dict[str, Any]]) -> str:
    """The capacity phase as text."""
    lines = [f"{'tokens':>6} {'N':>3} {'spec tok/s':>10} {'base tok/s':>10} {'ratio':>6} "
             f"{'spec p50':>8} {'spec p99':>8} {'base p50':>8} {'base p99':>8} "
             f"{'p50 x':>6} {'tok/step':>8} {'same':>5}"]
    for p in points:
        s, b = p["speculative"], p["target_only"]
        tps = "–" if s["tokens_per_step"] is None else f"{s['tokens_per_step']:.2f}"
        # Each mode alone at this load: the like-for-like latency speedup.
        speedup = b["latency_ms_p50"] / s["latency_ms_p50"]
        lines.append(
            f"{p['max_new_tokens']:>6} {p['clients']:>3} {s['goodput_tok_s']:>10.1f} "
            f"{b['goodput_tok_s']:>10.1f} {p['goodput_ratio']:>6.3f} "
            f"{s['latency_ms_p50']:>8.0f} {s['latency_ms_p99']:>8.0f} "
            f"{b['latency_ms_p50']:>8.0f} {b['latency_ms_p99']:>8.0f} {speedup:>6.3f} "
            f"{tps:>8} {p['identical_share']:>5.2f}")
    return "\n".join(lines)
