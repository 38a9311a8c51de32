"""Speculative vs target-only on the same stack: the toy pair, CPU, real gRPC.

Client -> edge -> cloud in one process. The cloud is the committed toy Video-LLaVA,
paced (``PacedEngine``) to a given prefill / step time to rehearse clouds of different
speed; the edge is the committed toy EventGPT on this CPU. A paced cloud plans with the
costs it is paced to; the unpaced one (0:0) calibrates afresh (a profile from an earlier
run, perhaps on a loaded machine, would decide the plan). One warm-up pair is asked and
not counted, then every question of
every scene is asked speculatively and target-only; the script prints medians of total
time and TTFT, the median per-request speedup, the acceptance (– when nothing was
drafted) and how many plans chose to draft. Outputs must be identical, or the script
exits 1.

    python -m benchmarks.bench_speculation [--scenes 8] [--paces 0:0 200:10 200:30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.engine.paced import PacedEngine
from eventspec.cloud.model_dirs import TOY_TARGET_DIR
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import load_target
from eventspec.edge.config import EdgeSettings
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.events.toy import ToySource
from eventspec.edge.model_dirs import TOY_ADAPTER_DIR, TOY_DRAFT_DIR
from eventspec.edge.server import EdgeServer
from eventspec.edge.vision.align import load_adapter
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.contract.types import AskSpec, FeatureMode, GenerationSettings, Mode
from eventspec.shared.toyworld.qa import all_questions
from eventspec.shared.toyworld.scenes import EVAL_SEED_MIN, sample_scene
from tests.support import cloud_harness as ch

SEED0 = EVAL_SEED_MIN + 5000


async def run_pace(prefill_ms: float, step_ms: float, scenes: int) -> dict[str, object]:
    target, draft = load_target(TOY_TARGET_DIR), load_draft(TOY_DRAFT_DIR)
    engine = PacedEngine(HFEngine(target), prefill_ms=prefill_ms, step_ms=step_ms)
    settings = ch.settings(max_sessions=4)
    scratch = tempfile.TemporaryDirectory(prefix="bench-speculation-")
    cloud = VerifierServer(replace(settings, profile_path=Path(scratch.name) / "cloud.msgpack"),
                           target=target, engine=engine)
    await cloud.start()
    seeds = range(SEED0, SEED0 + scenes)
    edge = EdgeServer(replace(EdgeSettings(), cloud=f"127.0.0.1:{cloud.port}", port=0),
                      source=ToySource(list(seeds)), draft=draft,
                      adapter=load_adapter(TOY_ADAPTER_DIR))
    await edge.start()
    spec_t, base_t, spec_ttft, base_ttft, ratios = [], [], [], [], []
    drafted = accepted = plans = same = asked = 0
    try:
        async with EdgeClient(f"127.0.0.1:{edge.port}") as client:
            warm = AskSpec("What is moving?", feature_mode=FeatureMode.FRAMES,
                           generation=GenerationSettings(max_new_tokens=12))
            await client.ask_final(warm)
            await client.ask_final(replace(warm, mode=Mode.TARGET_ONLY))
            for i, seed in enumerate(seeds):
                window = {"latest_ms": None, "t0_us": i * 1_000_000,
                          "t1_us": (i + 1) * 1_000_000}
                for qa in all_questions(sample_scene(seed)):
                    gen = GenerationSettings(max_new_tokens=12)
                    s = await client.ask_final(AskSpec(qa.question, mode=Mode.SPECULATIVE,
                                                       feature_mode=FeatureMode.FRAMES,
                                                       generation=gen, **window))
                    b = await client.ask_final(AskSpec(qa.question, mode=Mode.TARGET_ONLY,
                                                       feature_mode=FeatureMode.FRAMES,
                                                       generation=gen, **window))
                    asked += 1
                    same += s.token_ids == b.token_ids
                    spec_t.append(s.stats.total_ms)
                    base_t.append(b.stats.total_ms)
                    spec_ttft.append(s.stats.ttft_ms)
                    base_ttft.append(b.stats.ttft_ms)
                    ratios.append(b.stats.total_ms / s.stats.total_ms)
                    drafted += s.stats.drafted
                    accepted += s.stats.accepted
                    plans += bool(s.plan and s.plan.speculate)
    finally:
        await edge.stop(0)
        await cloud.stop(0)
        scratch.cleanup()
    return {
        "cloud_prefill_ms": prefill_ms, "cloud_step_ms": step_ms, "requests": asked,
        "spec_total_ms_median": round(statistics.median(spec_t), 1),
        "target_only_total_ms_median": round(statistics.median(base_t), 1),
        "speedup_median": round(statistics.median(ratios), 3),
        "spec_ttft_ms_median": round(statistics.median(spec_ttft), 1),
        "target_only_ttft_ms_median": round(statistics.median(base_ttft), 1),
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        "plans_drafting": plans, "identical": same == asked,
    }


def _rate(value: object) -> str:
    return "–" if value is None else f"{value:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenes", type=int, default=8)
    parser.add_argument("--paces", nargs="+", default=["0:0", "200:10", "200:30"],
                        help="PREFILL_MS:STEP_MS pairs for the cloud")
    args = parser.parse_args()
    results = []
    for pace in args.paces:
        p, s = (float(x) for x in pace.split(":"))
        res = asyncio.run(run_pace(p, s, args.scenes))
        print(json.dumps(res), flush=True)
        results.append(res)
    print(f"{'prefill/step ms':>16} {'spec ms':>8} {'base ms':>8} {'speedup':>8} "
          f"{'accept':>7} {'drafting':>9} identical")
    for r in results:
        print(f"{r['cloud_prefill_ms']:>8.0f}/{r['cloud_step_ms']:<7.0f} "
              f"{r['spec_total_ms_median']:>8.1f} {r['target_only_total_ms_median']:>8.1f} "
              f"{r['speedup_median']:>8.3f} {_rate(r['acceptance_rate']):>7} "
              f"{r['plans_drafting']:>4}/{r['requests']:<4} {r['identical']}")
    return 0 if all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
