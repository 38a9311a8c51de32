"""What ``--batch-invariant`` costs the static engine, and that it holds, in one run
(issue 24).

    python -m benchmarks.bench_invariant_cost --out "$OUT"     # on the GPU machine
    python -m benchmarks.bench_invariant_cost --tiny           # CPU smoke run (tiny target)

Builds the target once (full size with random bf16 weights on CUDA; ``--tiny``: the
tiny random target on CPU), then the default engine and the batch-invariant engine in
turn, the first freed before the second is built, each with the same slots and the
session buckets the comparison needs. For each: the prompt's prefill (video tower
included; median), and steps at B = 1, 16, 64 and k = 0, 8 at the prompt's context
(medians, as ``bench_engine.py`` times them). With the flag, also the invariance check
of ``bench_engine.py --invariance`` on the same engine: one session's logits alone and
beside 3, 15 and 63 others, k = 0 and 8, and 9-token steps against single steps.
Writes ``batch_invariant_cost_<device>.json`` (after each engine, so a late failure
keeps what was measured) and prints the table: ms without and with the flag, ratio.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench_engine import fit_sessions, time_prefill, time_steps
from benchmarks.device_timing import copy_bandwidth
from benchmarks.engine_agreement import batch_invariance
from benchmarks.engine_prefill import fill_slots
from benchmarks.stamp import write_result
from eventspec.cloud.engine.static.build import (
    build_static_engine,
    kv_bytes_per_slot,
    static_kv_plan,
)
from eventspec.cloud.target import TargetModel

#: The issue's points: B = 1, 16, 64 and k = 0, 8 (the tiny run: B = 1, 4).
SESSIONS = (1, 16, 64)
DRAFTS = (0, 8)
#: Session buckets: the timed B and the invariance check's 1 + 3, 1 + 15, 1 + 63.
BUCKETS = (1, 4, 16, 64)
TINY_SESSIONS = (1, 4)
TINY_BUCKETS = (1, 2, 4)


def measure(target: TargetModel, *, invariant: bool, sessions: tuple[int, ...],
            buckets: tuple[int, ...], max_seq: int, repeats: int,
            invariance_tokens: int) -> dict[str, Any]:
    """One engine's prefill and step times (and, with the flag, its invariance check)."""
    n_slots = max(sessions)
    kv = static_kv_plan(target, kv_cache_bytes=(n_slots + 1) * kv_bytes_per_slot(target, max_seq),
                        max_seq_len=max_seq)  # n_slots and the padding slot
    t0 = time.perf_counter()
    engine = build_static_engine(target, kv, session_buckets=tuple(b for b in buckets
                                                                   if b <= n_slots),
                                 token_buckets=(1, 9), batch_invariant=invariant)
    out: dict[str, Any] = {"batch_invariant": invariant,
                           "build_engine_s": time.perf_counter() - t0,
                           # the Triton kernels (CUDA), or the plain torch reference
                           "invariant_kernels": engine.invariant_kernels}
    out.update(time_prefill(engine, target, max(3, repeats // 2)))
    ctx = int(out["prompt_tokens"])
    fill_slots(engine, n_slots)
    weights = engine.weights.weight_bytes
    bandwidth = copy_bandwidth(target.device)  # the card's own copy rate: NaN on a CPU
    out["copy_bandwidth_gb_s"] = None if math.isnan(bandwidth) else bandwidth / 1e9
    out["steps"] = [{"B": r["B"], "k": r["k"], "ms": r["ms"], "floor_ms": r["floor_ms"]}
                    for r in time_steps(engine, ctx, bandwidth, weights, kv.bytes_per_token,
                                        repeats, sessions, DRAFTS)]
    if invariant:
        companions = tuple(c for c in (3, 15, 63) if c < n_slots) or (1,)
        out["invariance"] = batch_invariance(engine, target, invariance_tokens, companions)
    del engine
    gc.collect()
    if target.device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def compare(default: dict[str, Any], invariant: dict[str, Any]) -> dict[str, Any]:
    """Ratios with the flag over without: each step point, and the prefill."""
    base = {(r["B"], r["k"]): r["ms"] for r in default["steps"]}
    steps = [{"B": r["B"], "k": r["k"], "default_ms": base[(r["B"], r["k"])],
              "invariant_ms": r["ms"], "ratio": r["ms"] / base[(r["B"], r["k"])]}
             for r in invariant["steps"] if (r["B"], r["k"]) in base]  # fmt: skip
    return {"steps": steps, "prefill": {
        "default_ms": default["prefill_ms"], "invariant_ms": invariant["prefill_ms"],
        "ratio": invariant["prefill_ms"] / default["prefill_ms"]}}


def table(result: dict[str, Any]) -> str:
    """The README's table of a results file."""
    c = result["comparison"]
    lines = ["| B | k | default ms | `--batch-invariant` ms | ratio |", "|---|---|---|---|---|"]
    lines += [f"| {s['B']} | {s['k']} | {s['default_ms']:.2f} | {s['invariant_ms']:.2f} "
              f"| {s['ratio']:.2f} |" for s in c["steps"]]
    p = c["prefill"]
    lines.append(f"| prefill ({int(result['default']['prompt_tokens'])} tokens) | | "
                 f"{p['default_ms']:.1f} | {p['invariant_ms']:.1f} | {p['ratio']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run on the tiny target")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--max-seq-len", type=int, default=2560)
    ap.add_argument("--invariance-tokens", type=int, default=200)
    ap.add_argument("--out", default="benchmarks/results",
                    help="folder for batch_invariant_cost_<device>.json")
    ap.add_argument("--table", metavar="JSON", help="print a results file's table, exit")
    args = ap.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    t0 = time.perf_counter()
    if args.tiny:
        from eventspec.demoworld.tiny_target import build_tiny_random_target

        target = build_tiny_random_target(seed=0)
        sessions, buckets, max_seq, tokens = TINY_SESSIONS, TINY_BUCKETS, 512, 18
    else:
        from tests.support.fullsize import build_full_target

        target = build_full_target("cuda")
        sessions, buckets, max_seq = SESSIONS, BUCKETS, args.max_seq_len
        tokens = args.invariance_tokens
        sessions = fit_sessions(target, sessions, max_seq)
    device = torch.cuda.get_device_name() if target.device.type == "cuda" else "cpu"
    result: dict[str, Any] = {"device": device, "torch": torch.__version__,
                              "build_model_s": time.perf_counter() - t0, "partial": True}
    tag = "tiny" if args.tiny else device.replace(" ", "_").lower()
    path = Path(args.out) / f"batch_invariant_cost_{tag}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for name, flag in (("default", False), ("invariant", True)):
        result[name] = measure(target, invariant=flag, sessions=sessions, buckets=buckets,
                               max_seq=max_seq, repeats=args.repeats,
                               invariance_tokens=tokens)
        write_result(path, result)
    result["comparison"] = compare(result["default"], result["invariant"])
    result["partial"] = False
    write_result(path, result)
    print(table(result))
    print(json.dumps(result["invariant"].get("invariance"), indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
