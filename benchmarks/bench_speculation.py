"""Speculative vs target-only on the same stack, CPU, tiny-random models.

Runs client -> edge -> cloud in one process over real gRPC. The cloud is the real
engine slowed by a fixed delay per step (a stand-in for a loaded server), for several
delays. For each, it asks the same questions in ``speculative`` and ``target_only``
mode and prints medians of total time and TTFT, their ratio, the acceptance and the
plan's decision. With the two unrelated random tiny models acceptance is near zero, so
this measures what the design promises in that case: the plan learns a low acceptance,
stops drafting, and speculation costs (almost) nothing over target-only.

    python benchmarks/bench_speculation.py [--requests 6] [--max-new-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.client import EdgeClient  # noqa: E402
from shared.types import AskSpec, GenerationSettings, Mode  # noqa: E402
from tests.integration import edge_harness as eh  # noqa: E402

QUESTIONS = ["What is moving?", "Which way does it go?", "Describe the scene.",
             "How many objects are there?"]


async def run_case(step_delay_s: float, prefill_delay_s: float, requests: int,
                   max_new: int) -> dict[str, object]:
    stack = await eh.start_stack(slow=(prefill_delay_s, step_delay_s))
    rows: dict[str, list] = {"spec_total": [], "base_total": [], "spec_ttft": [],
                             "base_ttft": [], "acc": [], "drafted": [], "speculate": [],
                             "identical": []}
    try:
        async with EdgeClient(stack.edge_address) as client:
            gen = GenerationSettings(max_new_tokens=max_new)
            for i in range(requests):
                q = QUESTIONS[i % len(QUESTIONS)]
                s = await client.ask_final(AskSpec(q, mode=Mode.SPECULATIVE, generation=gen))
                b = await client.ask_final(AskSpec(q, mode=Mode.TARGET_ONLY, generation=gen))
                rows["spec_total"].append(s.stats.total_ms)
                rows["base_total"].append(b.stats.total_ms)
                rows["spec_ttft"].append(s.stats.ttft_ms)
                rows["base_ttft"].append(b.stats.ttft_ms)
                rows["acc"].append(s.stats.acceptance_rate)
                rows["drafted"].append(s.stats.drafted)
                rows["speculate"].append(bool(s.plan and s.plan.speculate))
                rows["identical"].append(s.token_ids == b.token_ids)
    finally:
        await stack.stop()
    spec, base = statistics.median(rows["spec_total"]), statistics.median(rows["base_total"])
    return {
        "step_delay_ms": step_delay_s * 1e3,
        "prefill_delay_ms": prefill_delay_s * 1e3,
        "spec_total_ms_median": round(spec, 1),
        "target_only_total_ms_median": round(base, 1),
        "speedup_median": round(base / spec, 3),
        "spec_ttft_ms_median": round(statistics.median(rows["spec_ttft"]), 1),
        "target_only_ttft_ms_median": round(statistics.median(rows["base_ttft"]), 1),
        "drafted_per_request": rows["drafted"],
        "acceptance_rate_mean": round(statistics.mean(rows["acc"]), 3),
        "plans_speculating": sum(rows["speculate"]),
        "all_identical": all(rows["identical"]),
    }


async def main_async(args: argparse.Namespace) -> list[dict[str, object]]:
    out = []
    for delay_ms in args.step_delays_ms:
        res = await run_case(delay_ms / 1e3, args.prefill_delay_ms / 1e3, args.requests,
                             args.max_new_tokens)
        print(json.dumps(res), flush=True)
        out.append(res)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--prefill-delay-ms", type=float, default=300.0)
    parser.add_argument("--step-delays-ms", type=float, nargs="+", default=[0.0, 30.0, 100.0])
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    print(f"{'step delay':>10} {'spec ms':>9} {'base ms':>9} {'speedup':>8} "
          f"{'accept':>7} {'spec plans':>10} identical")
    for r in results:
        print(f"{r['step_delay_ms']:>10.0f} {r['spec_total_ms_median']:>9.1f} "
              f"{r['target_only_total_ms_median']:>9.1f} {r['speedup_median']:>8.3f} "
              f"{r['acceptance_rate_mean']:>7.3f} {r['plans_speculating']:>10} "
              f"{r['all_identical']}")
    return 0 if all(r["all_identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
