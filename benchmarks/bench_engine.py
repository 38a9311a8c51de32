"""The static-KV engine on a GPU, full-size Video-LLaVA-7B architecture, random bf16 weights.

One run measures, and writes to ``$OUT/engine_<card>.json`` and ``.png``:

- copy bandwidth (device-to-device, read + write counted), the floor's denominator;
- prefill ms: 8 frames + prompt (2,103 tokens), video tower included
  (``--prefill-only``: its parts graphed against eager, a new prompt length's first
  call, and a 512-row prompt piece inside a step, graphed, eager and apart, in
  ``prefill-<card>.json``);
- step ms for B sessions x k drafts (k + 1 tokens per session) at ~2.1k context, each
  next to its floor, (weights + live KV bytes) / copy bandwidth, and the ratio;
- the HF eager reference step at B = 1 (DynamicCache, k = 0 and 8);
- the attention choice: the Triton split-KV kernel, dense masked SDPA over whole slots
  (what a plain static loop does) and FlexAttention with a block mask, per layer call;
- a kernel-time breakdown (torch.profiler) of the B = 1, k = 0 and B = 64, k = 8 steps;
- greedy agreement with HF eager on the same inputs (bf16 near-ties), and between the
  engine's own single-token and 9-token steps (speculative vs target-only);
- warm-up time and peak memory;
- with ``--trace-dir DIR``, chrome traces of the B = 1, k = 0 step, graphed and eager
  (:mod:`benchmarks.step_trace`).

Timing does not depend on weight values; slots beyond the first get a copy of its KV.

    python -m benchmarks.bench_engine                 # GPU, full size
    python -m benchmarks.bench_engine --tiny          # CPU smoke run of the same code
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import (
    DynamicCache,
)

from benchmarks.device_timing import (
    bandwidth_floor_ms,
    copy_bandwidth,
    floor_text,
    median_ms,
    sync,
)
from benchmarks.engine_agreement import QUESTION, agreement, batch_invariance, pixels
from benchmarks.engine_prefill import fill_slots, mixed_costs, prefill_costs
from benchmarks.engine_report import markdown, plot
from benchmarks.stamp import card_tag, write_result
from benchmarks.step_trace import without_graphs, write_step_traces
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.build import (
    build_static_engine,
    kv_bytes_per_slot,
    static_kv_plan,
)
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.node.kvcache import crop_cache
from eventspec.shared.node.static.attention import HAVE_TRITON, num_splits_for, splitkv_attention
from eventspec.shared.node.static.batch import StepBatch
from tests.support.fullsize import build_full_target

SESSIONS = (1, 4, 16, 32, 64)
DRAFTS = (0, 4, 8, 16)


def time_prefill(engine: StaticEngine, target: TargetModel, repeats: int) -> dict[str, float]:
    ids = target.build_prompt_ids(QUESTION)
    pix = pixels(target, 0)
    req = PrefillRequest(slot=0, input_ids=ids, pixel_values_videos=pix)
    ms = median_ms(lambda: engine.prefill([req]), repeats)
    tower = median_ms(lambda: target.video_features_from_pixels(pix), repeats)
    return {"prompt_tokens": float(len(ids)), "prefill_ms": ms, "tower_ms": tower}


def time_steps(
    engine: StaticEngine, ctx: int, bandwidth: float, weight_bytes: int, kv_per_token: int,
    repeats: int, sessions: tuple[int, ...], drafts: tuple[int, ...],
) -> list[dict[str, float]]:  # fmt: skip
    rows = []
    for b in sessions:
        for k in drafts:
            q = k + 1
            batch = StepBatch(
                slots=tuple(range(b)),
                start_positions=(ctx,) * b,
                counts=(q,) * b,
                token_ids=torch.randint(5, 500, (b * q,), device=engine.device),
            )
            ms = median_ms(lambda batch=batch: engine.step(batch), repeats)  # type: ignore[misc]
            floor = bandwidth_floor_ms(weight_bytes + b * (ctx + q) * kv_per_token, bandwidth)
            rows.append({"B": b, "k": k, "ms": ms, "floor_ms": floor,
                         "ratio": ms / floor if floor else None})
            logging.info("step B=%d k=%d: %.2f ms (floor %s)", b, k, ms,
                         f"{floor:.2f}" if floor else "unknown: no measured bandwidth")
    return rows


def hf_step_ms(target: TargetModel, repeats: int) -> dict[str, float]:
    """HF eager reference: one session, DynamicCache, at the prompt's context."""
    ids = target.build_prompt_ids(QUESTION)
    cache = DynamicCache(config=target.model.config)
    with torch.inference_mode():
        target.model(input_ids=torch.tensor([ids], device=target.device),
                     pixel_values_videos=pixels(target, 0), past_key_values=cache,
                     use_cache=True, logits_to_keep=1)  # fmt: skip
    out = {}
    for k in (0, 8):
        toks = torch.full((1, k + 1), 7, device=target.device)

        def one(toks: torch.Tensor = toks) -> None:
            with torch.inference_mode():
                target.model(input_ids=toks, past_key_values=cache)
            crop_cache(cache, len(ids))

        out[f"hf_step_k{k}_ms"] = median_ms(one, repeats)
    return out


def attention_choice(
    engine: StaticEngine, ctx: int, repeats: int, shapes: tuple[tuple[int, int], ...]
) -> list[dict[str, Any]]:
    """One layer's attention, three ways, on the engine's own cache and shapes."""
    w = engine.weights
    kc, vc = engine.k_cache[0], engine.v_cache[0]  # [S+1, Hkv, T, D]
    dev, t = engine.device, engine.max_seq_len
    out = []
    for b, q in shapes:
        qt = torch.randn(b, q, w.num_heads, w.head_dim, device=dev, dtype=engine.dtype)
        slots = torch.arange(b, device=dev)
        starts = torch.full((b,), ctx, device=dev)
        lens = starts + q
        row: dict[str, Any] = {"B": b, "q": q}
        if HAVE_TRITON and dev.type == "cuda":
            ns = num_splits_for(b, w.num_heads, engine.sm_count)
            args = (qt, kc, vc, slots, starts, lens)
            row["splitkv_ms"] = median_ms(partial(splitkv_attention, *args, num_splits=ns), repeats)
            row["splitkv_num_splits"] = ns
            for splits in (1, 4, 8, 16, 32):
                for block_n in (32, 64, 128):
                    fn = partial(splitkv_attention, *args, num_splits=splits, block_n=block_n)
                    row[f"splitkv_s{splits}_n{block_n}_ms"] = median_ms(fn, repeats)
        pos = torch.arange(t, device=dev)
        qpos = starts[:, None] + torch.arange(q, device=dev)  # [B, q]
        mask = (pos[None, None] <= qpos[:, :, None]) & (pos[None, None] < lens[:, None, None])
        qh = qt.transpose(1, 2)  # [B, H, q, D]
        dense = (qh, kc[:b], vc[:b], mask[:, None])
        sdpa = torch.nn.functional.scaled_dot_product_attention
        row["dense_sdpa_ms"] = median_ms(partial(sdpa, *dense[:3], attn_mask=dense[3]), repeats)
        try:
            if dev.type != "cuda":
                raise RuntimeError("FlexAttention is measured on CUDA only")
            row.update(_flex(qh, kc[:b], vc[:b], starts, lens, repeats))
        except Exception as exc:  # a measurement, recorded either way
            row["flex_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        out.append(row)
        logging.info("attention %s", row)
    return out


def _flex(qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor,
          lens: torch.Tensor, repeats: int) -> dict[str, float]:  # fmt: skip
    """FlexAttention's decoding path with a per-step BlockMask over each session's length."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, _, q, _ = qh.shape
    t = k.shape[2]

    def live(bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
        return (ki <= starts[bi] + qi) & (ki < lens[bi])

    flex = torch.compile(flex_attention)
    mask_ms = median_ms(lambda: create_block_mask(live, b, None, q, t, device=qh.device), 5)
    block_mask = create_block_mask(live, b, None, q, t, device=qh.device)
    ms = median_ms(lambda: flex(qh, k, v, block_mask=block_mask), repeats)
    return {"flex_ms": ms, "flex_block_mask_ms": mask_ms}


def _kernel_table(prof: Any) -> dict[str, Any]:
    """Device ms by kernel family, plus the top kernels by name."""
    fam: dict[str, float] = {}
    top: list[tuple[float, int, str]] = []
    count = 0
    for ev in prof.key_averages():
        us = float(getattr(ev, "device_time_total", 0.0) or 0.0)
        if us <= 0 or ev.key.startswith(("ProfilerStep", "aten::", "cuda")):
            continue
        name = ev.key.lower()
        if "splitkv" in name or "combine" in name or "flash" in name or "fmha" in name:
            key = "attention"
        elif any(s in name for s in ("gemm", "gemv", "nvjet", "cutlass", "sm90_xmma")):
            key = "gemm"
        elif "triton" in name:
            key = "fused_elementwise"
        else:
            key = "other"
        fam[key] = fam.get(key, 0.0) + us / 1e3
        count += ev.count
        top.append((us / 1e3, ev.count, ev.key[:90]))
    top.sort(reverse=True)
    fam["kernels"] = float(count)
    fam["device_total_ms"] = sum(v for kk, v in fam.items() if kk != "kernels")
    return {**fam, "top": [{"ms": ms, "n": n, "name": nm} for ms, n, nm in top[:14]]}


def profile_step(engine: StaticEngine, ctx: int, b: int, k: int) -> dict[str, Any]:
    """Device time by kernel family for one eager step of (B, k): where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    q = k + 1
    batch = StepBatch(tuple(range(b)), (ctx,) * b, (q,) * b,
                      torch.randint(5, 500, (b * q,), device=engine.device))  # fmt: skip
    with without_graphs(engine):
        engine.step(batch)
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.step(batch)
            sync()
    return _kernel_table(prof)


def profile_prefill(engine: StaticEngine, target: TargetModel) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    ids = target.build_prompt_ids(QUESTION)
    req = PrefillRequest(slot=0, input_ids=ids, pixel_values_videos=pixels(target, 0))
    engine.prefill([req])
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.prefill([req])
        sync()
    return _kernel_table(prof)


def replay_ms(engine: StaticEngine, repeats: int) -> dict[str, float]:
    """Graph replay alone per bucket of the table (the step minus its host work)."""
    out = {}
    for (bp, qp), graph in engine.step_graphs.items():
        if bp in SESSIONS and qp in (1, 5, 9, 17):
            out[f"B{bp}_q{qp}"] = median_ms(graph.replay, repeats)
    return out


def host_phases(engine: StaticEngine, ctx: int, b: int, k: int, repeats: int) -> dict[str, float]:
    """Median ms of each part of one graphed ``step``, each bracketed by device syncs."""
    q = k + 1
    batch = StepBatch(tuple(range(b)), (ctx,) * b, (q,) * b,
                      torch.randint(5, 500, (b * q,), device=engine.device))  # fmt: skip
    bp, qp = b, q
    graph = engine.step_graphs.get((bp, qp))
    staging = engine.step_staging
    layout = staging.layout
    block, dest_np = staging.host_meta(
        layout, batch.slots, batch.start_positions, batch.counts, bp, qp
    )
    packed = torch.from_numpy(block)
    staged = staging.to_device(block)
    dest = torch.from_numpy(dest_np).to(engine.device)
    logits = engine.logits_buffer[: bp * qp]
    parts: dict[str, Callable[[], object]] = {
        "whole_step": lambda: engine.step(batch),
        "host_meta_numpy": lambda: staging.host_meta(
            layout, batch.slots, batch.start_positions, batch.counts, bp, qp
        ),
        "pin_and_copy": lambda: staging.to_device(block),
        "pin_only": lambda: packed.pin_memory() if engine.device.type == "cuda" else packed,
        "meta_copy_and_ids_scatter": lambda: (
            staging.meta.copy_(staged),
            staging.ids.index_copy_(0, dest, batch.token_ids),
        ),
        "load_step": lambda: staging.load(batch, bp, qp),
        "replay": graph.replay if graph is not None else lambda: None,
        "gather_float": lambda: logits.index_select(0, dest).float(),
    }
    return {name: median_ms(fn, repeats) for name, fn in parts.items()}


def fit_sessions(target: TargetModel, sessions: tuple[int, ...], max_seq: int
                 ) -> tuple[int, ...]:
    """The batch sizes whose slots (plus the padding slot) fit this card's free memory
    less the engine's reserve: on an 80 GB card 64 slots of 4,096 positions (98 GiB)
    do not, so the largest sizes are left out (logged) instead of failing."""
    if target.device.type != "cuda":
        return sessions
    fit = static_kv_plan(target, kv_cache_bytes=None, max_seq_len=max_seq,
                         max_slots=max(sessions))
    kept = tuple(b for b in sessions if b <= fit.num_slots) or (fit.num_slots,)
    if kept != sessions:
        logging.warning("%s; batch sizes %s left out", fit.describe(),
                        [b for b in sessions if b not in kept])
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run on the tiny target")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--max-seq-len", type=int, default=2560)
    parser.add_argument("--agree-tokens", type=int, default=300)
    parser.add_argument("--compile", action="store_true", help="Inductor RMSNorm instead")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--host-phases", action="store_true", help="only time step parts")
    parser.add_argument("--invariance", action="store_true", help="only batch invariance")
    parser.add_argument("--prefill-only", action="store_true",
                        help="only the prefill's parts, graphed and eager (prefill-<card>.json)")
    parser.add_argument("--batch-invariant", action="store_true",
                        help="build the engine batch-invariant (the cloud's --batch-invariant)")
    parser.add_argument("--table", metavar="JSON", help="print a results file's table, exit")
    parser.add_argument("--trace-dir", metavar="DIR",
                        help="also write chrome traces of the B=1, k=0 step there (gzip)")
    args = parser.parse_args()
    if args.table:
        print(markdown(json.loads(Path(args.table).read_text())))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    t0 = time.perf_counter()
    sessions: tuple[int, ...]
    drafts: tuple[int, ...]
    if args.tiny:
        target = build_tiny_random_target(seed=0)
        sessions, drafts, max_seq = (1, 4), (0, 4), 512
    else:
        target = build_full_target("cuda")
        sessions, drafts, max_seq = SESSIONS, DRAFTS, args.max_seq_len
    build_s = time.perf_counter() - t0
    dev = target.device
    sessions = fit_sessions(target, sessions, max_seq)
    n_slots = max(sessions)
    kv = static_kv_plan(target, kv_cache_bytes=(n_slots + 1) * kv_bytes_per_slot(target, max_seq),
                        max_seq_len=max_seq)  # n_slots and the padding slot
    t0 = time.perf_counter()
    # The card's model ("h200"), as every output of this script is named.
    tag = "tiny" if args.tiny else card_tag(
        torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "cuda")
    if args.invariance:
        engine = build_static_engine(target, kv, token_buckets=(1, 9),
                                     batch_invariant=args.batch_invariant)
        engine.prefill([PrefillRequest(0, target.build_prompt_ids(QUESTION), pixels(target, 0))])
        fill_slots(engine, n_slots)
        companions = tuple(c for c in ((3, 15, 63) if not args.tiny else (1, 3)) if c < n_slots)
        inv = batch_invariance(engine, target, 200 if not args.tiny else 18, companions)
        print(json.dumps(inv, indent=1))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_result(Path(args.out, f"engine_{tag}_batch_invariance.json"), inv)
        return 0
    if args.prefill_only:
        mixed_sessions = (1, 2) if args.tiny else (1, 16)
        rows = 64 if args.tiny else 512
        engine = build_static_engine(target, kv, session_buckets=mixed_sessions,
                                     token_buckets=(1, 9, 33), chunk_buckets=(64, rows))
        costs = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                 "torch": torch.__version__, "warm_up": engine.warmup_report,
                 **prefill_costs(engine, target, args.repeats)}
        ctx = int(costs["prompt_tokens"])
        costs["mixed_step"] = mixed_costs(engine, ctx, args.repeats, mixed_sessions, rows)
        print(json.dumps(costs, indent=1))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_result(Path(args.out, f"prefill-{tag}.json"), costs)
        return 0
    if args.host_phases:
        engine = build_static_engine(target, kv, session_buckets=(1, 64), token_buckets=(1, 9),
                                     batch_invariant=args.batch_invariant)
        ctx = len(target.build_prompt_ids(QUESTION))
        engine.prefill([PrefillRequest(0, target.build_prompt_ids(QUESTION), pixels(target, 0))])
        fill_slots(engine, n_slots)
        pairs = ((1, 0), (n_slots, 8))
        phases = {f"B{b}_k{k}": host_phases(engine, ctx, b, k, 50) for b, k in pairs}
        print(json.dumps(phases, indent=1))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_result(Path(args.out, f"engine_{tag}_host_phases.json"), phases)
        return 0
    engine = build_static_engine(target, kv, compile_layers=args.compile,
                                 batch_invariant=args.batch_invariant)
    engine_s = time.perf_counter() - t0
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "compile_layers": args.compile,
        "batch_invariant": args.batch_invariant,
        "build_model_s": build_s,
        "build_engine_s": engine_s,
        "warm_up": engine.warmup_report,
        "num_slots": engine.num_slots,
        "sessions": list(sessions),
        "max_seq_len": max_seq,
        "token_buckets": list(engine.token_buckets),
        "session_buckets": list(engine.session_buckets),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every stage, so a late failure keeps what was measured
        write_result(out / f"engine_{tag}.json", result, indent=2)

    def stage(name: str, fn: Callable[[], Any]) -> None:
        try:
            value = fn()
            if isinstance(value, dict) and name == "":
                result.update(value)
            else:
                result[name] = value
        except Exception as exc:  # record it, go on to the next stage
            logging.exception("stage %s failed", name)
            result[f"{name or 'stage'}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        save()

    bw = copy_bandwidth(dev) if dev.type == "cuda" else 50e9
    result["copy_bandwidth_GBps"] = bw / 1e9
    weight_bytes = engine.weights.weight_bytes
    result["weight_GB"] = weight_bytes / 1e9
    kv_per_token = kv.bytes_per_token
    result.update(time_prefill(engine, target, max(3, args.repeats // 2)))
    ctx = int(result["prompt_tokens"])
    fill_slots(engine, n_slots)
    stage("steps", lambda: time_steps(engine, ctx, bw, weight_bytes, kv_per_token,
                                      args.repeats, sessions, drafts))  # fmt: skip
    shapes = tuple((b, q) for b, q in ((1, 1), (1, 9), (16, 9), (64, 9)) if b <= n_slots) \
        if not args.tiny else ((1, 1),)
    stage("attention_per_layer", lambda: attention_choice(engine, ctx, args.repeats, shapes))
    if dev.type == "cuda":
        stage("replay_only_ms", lambda: replay_ms(engine, args.repeats))
        stage("profile", lambda: {f"B{b}_k{k}": profile_step(engine, ctx, b, k)
                                  for b, k in ((1, 0), (16, 8), (64, 8))
                                  if b <= n_slots})  # fmt: skip
        stage("profile_prefill", lambda: profile_prefill(engine, target))
    if args.trace_dir:
        stage("trace", lambda: write_step_traces(engine, ctx, Path(args.trace_dir), tag))
    stage("hf_eager", lambda: hf_step_ms(target, max(3, args.repeats // 2)))
    n_agree = args.agree_tokens if not args.tiny else 20
    stage("agreement", lambda: agreement(engine, target, n_agree))
    if dev.type == "cuda":
        result["peak_gpu_mem_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    save()
    try:
        plot(result, out / f"engine_{tag}.png")
    except ImportError as exc:
        logging.warning("no plot: %s", exc)
    print(f"{'B':>3} {'k':>3} {'ms':>8} {'floor':>8} {'ratio':>6}")
    for r in result["steps"]:
        ratio = f"{r['ratio']:>6.2f}" if r["ratio"] else f"{'-':>6}"
        print(f"{r['B']:>3} {r['k']:>3} {r['ms']:>8.2f} {floor_text(r['floor_ms']):>8} {ratio}")
    summary = {k: v for k, v in result.items() if k not in ("steps",)}
    print(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
