"""What one prefill call costs as it groups more requests (the scheduler's prefill groups).

    python -m benchmarks.bench_prefill [--model toy] [--device cpu] [--groups 1 4 8]

Builds the static engine on the committed toy Video-LLaVA (or ``--model DIR``) and times
``engine.prefill`` of R requests in one call (median of ``--repeats``), so the per-request
cost of a group can be set against a single prefill. One extra call is profiled with
torch.profiler to give the share of the GEMMs (``aten::mm`` + ``aten::addmm``). Writes
``benchmarks/results/prefill-<device>.json``; docs/scheduler.md quotes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_capacity import requests
from benchmarks.stamp import write_result
from eventspec.cloud.config import CloudSettings
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.build import build_static_engine, static_kv_plan
from eventspec.cloud.server import load_target_for

RESULTS = Path(__file__).resolve().parent / "results"
GEMM_OPS = ("aten::mm", "aten::addmm")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="toy")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target_for(replace(CloudSettings(), model=args.model, device=args.device))
    top = max(args.groups)
    kv = static_kv_plan(target, kv_cache_bytes=None, max_seq_len=512, max_slots=top)
    engine = build_static_engine(target, kv, use_graphs=False)
    reqs = requests(top, 32)
    prefills = [PrefillRequest(i, target.build_prompt_ids(r.question),
                               target.preprocess_frames(r.frames) if r.frames else None)
                for i, r in enumerate(reqs)]
    engine.prefill(prefills[:1])  # warm-up
    rows = []
    for r in args.groups:
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            engine.prefill(prefills[:r])
            times.append((time.perf_counter() - t0) * 1e3)
        call = statistics.median(times)
        rows.append({"requests": r, "call_ms": round(call, 2),
                     "per_request_ms": round(call / r, 2)})
        print(f"{r:>3} requests in one call: {call:8.2f} ms, {call / r:7.2f} ms per request")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.prefill(prefills[:1])
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    gemm = sum(e.self_cpu_time_total for e in events if e.key in GEMM_OPS)
    share = gemm / total if total else 0.0
    print(f"GEMMs ({' + '.join(GEMM_OPS)}): {share:.0%} of one prefill's CPU time")
    result = {"model": target.model_id, "device": args.device, "threads": args.threads,
              "prompt_tokens": len(prefills[0].input_ids), "groups": rows,
              "gemm_share_of_one_prefill": round(share, 3)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"prefill-{args.device.replace(':', '')}.json"
    write_result(out, result, indent=2)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
