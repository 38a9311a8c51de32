"""Capacity of one verifier: N concurrent requests through the real server over gRPC.

The cloud is an in-process ``VerifierServer`` (port 0, real gRPC) with the committed toy
Video-LLaVA (or ``--model DIR``). The same R requests (toy scenes x questions, greedy)
are served with N = 1, 4, 16 ... concurrent clients. For each N the script reports
tokens/s, p50/p99 request latency, and the histogram of batch sizes the scheduler ran.
Then the same with drafts from an **oracle edge client**: it replays each request's
target-only answer as drafts, each token wrong with probability 1 - alpha (labelled as
such: it measures the verifier, not an edge). Answers must be identical across N and
modes, or the script exits 1.

    python -m benchmarks.bench_capacity [--concurrency 1 4 16] [--requests 32]
        [--alpha 0.8] [--draft-k 4] [--max-new-tokens 32] [--device cpu]
        [--emulate-prefill-ms 50 --emulate-step-ms 20]

With ``--emulate-*`` the engine is paced (``PacedEngine``): each prefill call and each
batched step lasts at least the given time whatever the batch, which rehearses an engine
whose step cost is flat in the batch size (a bandwidth-bound GPU) on a CPU. The HF
reference engine alone loops over the sessions of a batch, so on CPU its batched step
costs B single steps.

Writes ``benchmarks/results/capacity-<device>[-paced<P>-<S>].json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import torch
from grpc import aio

from benchmarks.stamp import write_result
from eventspec.cloud.config import CloudSettings
from eventspec.cloud.server import VerifierServer, load_target_for
from eventspec.cloud.target import TargetModel
from eventspec.shared.contract import convert_verifier
from eventspec.shared.contract.types import (
    CommitEvent,
    DoneEvent,
    GenerationSettings,
    OpenRequest,
    ServerLimits,
)
from eventspec.shared.node.imageproc import encode_jpeg
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.toyworld.qa import all_questions
from eventspec.shared.toyworld.scenes import EVAL_SEED_MIN, clip_frames, sample_scene
from tests.support.cloud_harness import TEST_COST

RESULTS = Path(__file__).resolve().parent / "results"
SEED0 = EVAL_SEED_MIN + 7000


def requests(n: int, max_new: int) -> list[OpenRequest]:
    """n distinct questions about toy scenes, frames as JPEG like a real edge sends."""
    out: list[OpenRequest] = []
    seed = SEED0
    while len(out) < n:
        scene = sample_scene(seed)
        frames = tuple(encode_jpeg(f, 90) for f in clip_frames(scene))
        for qa in all_questions(scene):
            if len(out) == n:
                break
            out.append(OpenRequest(
                request_id=f"cap-{len(out)}", question=qa.question,
                generation=GenerationSettings(max_new_tokens=max_new), frames=frames,
                speculative=False,
            ))
        seed += 1
    return out


def oracle_tail(truth: list[int], base: int, k: int, alpha: float, rng: random.Random,
                vocab: int) -> list[int]:
    """The next k tokens of the target-only answer, each wrong with probability 1 - alpha."""
    tail = [t if rng.random() < alpha else (t + 1 + rng.randrange(vocab - 1)) % vocab
            for t in truth[base : base + k]]
    return tail


async def one_request(port: int, req: OpenRequest, *, truth: list[int] | None, k: int,
                      alpha: float, vocab: int, seed: int
                      ) -> tuple[list[int], float, int, float, float]:
    """Run one Generate; returns (tokens, latency s, drafts accepted, TTFT s as the client
    saw it, TTFT ms as the server measured it)."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    async with aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=600)
        await call.write(verifier_pb2.EdgeMessage(open=convert_verifier.open_to_pb(req)))
        if truth is not None:
            hidden = oracle_tail(truth, 0, k, alpha, rng, vocab)
            if hidden:
                await call.write(verifier_pb2.EdgeMessage(
                    drafts=verifier_pb2.Drafts(base=0, token_ids=hidden)))
        got: list[int] = []
        ttft = 0.0
        while True:
            msg = await call.read()
            if msg is aio.EOF:
                raise RuntimeError(f"{req.request_id}: the stream ended without Done")
            event = convert_verifier.cloud_message_from_pb(msg)
            if isinstance(event, DoneEvent):
                break
            if isinstance(event, CommitEvent):
                ttft = ttft or time.perf_counter() - t0
                got.extend(event.token_ids)
                if truth is not None:
                    tail = oracle_tail(truth, len(got), k, alpha, rng, vocab)
                    if tail:
                        await call.write(verifier_pb2.EdgeMessage(
                            drafts=verifier_pb2.Drafts(base=len(got), token_ids=tail)))
        await call.done_writing()
    return (list(event.token_ids), time.perf_counter() - t0, event.stats.accepted, ttft,
            event.stats.ttft_ms)


async def run_level(server: VerifierServer, reqs: list[OpenRequest], n: int, *,
                    truths: list[list[int]] | None, k: int, alpha: float,
                    vocab: int) -> dict[str, object]:
    """All requests through n concurrent clients; returns the measurements."""
    assert server.runtime is not None
    stats = server.runtime.scheduler.stats
    hist_before, steps_before = Counter(stats.batch_sizes), stats.steps
    engine_before, overhead_before = stats.engine_ms, stats.overhead_ms
    sampler_before = stats.sampler_ms
    prefills_before, prefill_ms_before = stats.prefills, stats.prefill_ms
    prefill_wait_before = stats.prefill_wait_ms
    device_before = (stats.engine_device_ms, stats.device_timed_steps)
    kv_queue = server.runtime.kv_queue
    waited_before = kv_queue.admitted_after_wait if kv_queue is not None else 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(reqs)):
        queue.put_nowait(i)
    answers: list[list[int]] = [[] for _ in reqs]
    latencies: list[float] = [0.0] * len(reqs)
    ttfts: list[float] = [0.0] * len(reqs)
    server_ttfts: list[float] = [0.0] * len(reqs)
    accepted = [0]

    async def client() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            spec_req = replace(reqs[i], speculative=truths is not None)
            tokens, latency, acc, ttft, server_ttft = await one_request(
                server.port, spec_req, truth=None if truths is None else truths[i], k=k,
                alpha=alpha, vocab=vocab, seed=i)
            answers[i], latencies[i], ttfts[i] = tokens, latency, ttft
            server_ttfts[i] = server_ttft
            accepted[0] += acc

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(n)))
    wall = time.perf_counter() - t0
    hist = Counter(stats.batch_sizes)
    hist.subtract(hist_before)
    tokens = sum(len(a) for a in answers)
    steps = stats.steps - steps_before
    prefills = max(1, stats.prefills - prefills_before)
    step_wall_ms = ((stats.engine_ms - engine_before) + (stats.sampler_ms - sampler_before)
                    + (stats.overhead_ms - overhead_before))
    lat = sorted(latencies)
    return {
        "concurrency": n,
        "requests": len(reqs),
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "latency_p50_s": round(statistics.median(lat), 3),
        "latency_p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3),
        "ttft_p50_ms": round(statistics.median(ttfts) * 1e3, 2),
        # From Open received to the first Commit handed to gRPC, as Done.stats reports it.
        "server_ttft_p50_ms": round(statistics.median(server_ttfts), 2),
        # Engine prefill call plus first-token sampling, and the wait before it starts.
        "prefill_ms_mean": round((stats.prefill_ms - prefill_ms_before) / prefills, 2),
        "prefill_wait_ms_mean": round(
            (stats.prefill_wait_ms - prefill_wait_before) / prefills, 2),
        # Wall time of one scheduler step (engine + sampler + loop work), and the share of
        # the level's wall time the engine thread spent in prefills.
        "in_server_step_ms": round(step_wall_ms / max(1, steps), 3),
        "prefill_share_of_wall": round(
            (stats.prefill_ms - prefill_ms_before) / 1e3 / wall, 3),
        # Per answer token after the first, as a client sees it (decode only).
        "ms_per_token_p50": round(statistics.median(
            (lt - tt) * 1e3 / max(1, len(a) - 1)
            for lt, tt, a in zip(latencies, ttfts, answers, strict=True)), 2),
        "target_steps": steps,
        "tokens_per_target_step": round(tokens / max(1, steps), 2),
        "drafts_accepted": accepted[0],
        "batch_size_histogram": {str(b): c for b, c in sorted(hist.items()) if c},
        # The most sessions one step held (KV holds at least that many at once), and the
        # requests that waited in the KV queue before they got KV.
        "max_sessions_in_a_step": max((b for b, c in hist.items() if c), default=0),
        "kv_queue_waits": (kv_queue.admitted_after_wait - waited_before
                           if kv_queue is not None else 0),
        # Host time around the engine call (on CUDA only its launch) and the device's.
        "engine_ms_per_step": round((stats.engine_ms - engine_before) / max(1, steps), 3),
        "engine_device_ms_per_step": round(
            (stats.engine_device_ms - device_before[0])
            / max(1, stats.device_timed_steps - device_before[1]), 3),
        "sampler_ms_per_step": round((stats.sampler_ms - sampler_before) / max(1, steps), 3),
        "scheduler_overhead_ms_per_step": round(
            (stats.overhead_ms - overhead_before) / max(1, steps), 3),
        "answers": answers,
    }


async def main_async(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    top = max(args.concurrency)
    settings = replace(
        CloudSettings(), model=args.model, device=args.device, dtype=args.dtype, port=0,
        recalibrate=True, limits=replace(
            ServerLimits(), max_sessions=top, max_new_tokens=max(512, args.max_new_tokens)),
        kv_cache_gb=args.kv_cache_gb, max_seq_len=args.max_seq_len, engine=args.engine,
        emulate_prefill_ms=args.emulate_prefill_ms, emulate_step_ms=args.emulate_step_ms,
        profile_path=RESULTS / ".capacity-profile.msgpack", batch_invariant=args.batch_invariant,
        kv_layout=args.kv_layout, gil_switch_interval_ms=args.gil_switch_interval_ms,
    )
    if args.model == "full-size-random":
        from tests.support.fullsize import build_full_target

        target = build_full_target(args.device, getattr(torch, args.dtype))
    else:
        target = load_target_for(settings)
    # Without --calibrate, an unpaced engine plans with the harness's fixed test costs
    # (recorded as published_cost_model); a paced one plans with the costs it is paced to.
    fixed = None if args.calibrate or args.emulate_step_ms > 0 else TEST_COST
    server = VerifierServer(settings, target=target, cost=fixed)
    await server.start()
    try:
        reqs = requests(args.requests, args.max_new_tokens)
        preprocess_ms = _preprocess_ms(target, reqs[0])
        await run_level(server, reqs[:2], 1, truths=None, k=0, alpha=0.0,
                        vocab=target.text_vocab_size)  # warm-up
        levels: list[dict[str, object]] = []
        for n in args.concurrency:
            levels.append({"mode": "target_only",
                           **await run_level(server, reqs, n, truths=None, k=0, alpha=0.0,
                                             vocab=target.text_vocab_size)})
            print(_row(levels[-1]), flush=True)
        truths = levels[0]["answers"]
        assert isinstance(truths, list)
        for n in args.concurrency:
            levels.append({"mode": f"oracle_edge_alpha{args.alpha:g}_k{args.draft_k}",
                           **await run_level(server, reqs, n, truths=truths, k=args.draft_k,
                                             alpha=args.alpha, vocab=target.text_vocab_size)})
            print(_row(levels[-1]), flush=True)
        assert server.runtime is not None
        info = server.runtime.info
        engine_name = type(server.runtime.scheduler.engine).__name__
        arena_positions = getattr(server.runtime.scheduler.engine, "kv_positions", None)
    finally:
        await server.stop(0)
    identical = all(level["answers"] == truths for level in levels)
    agreement = _agreement(truths, levels)
    # bf16 kernels are not batch-invariant (docs/engine.md): near-ties flip with the batch
    # shape, so only float32 runs must agree exactly across N.
    strict = args.dtype == "float32" or args.batch_invariant
    base = levels[0]["tokens_per_s"]
    assert isinstance(base, float)
    result = {
        "what": "N concurrent Generate streams through one in-process verifier over gRPC; "
                "oracle_edge rows replay the target-only answer as drafts with errors "
                "injected at rate 1 - alpha (not a real edge)",
        "model": target.model_id, "device": args.device, "dtype": args.dtype,
        "torch_threads": args.threads, "max_new_tokens": args.max_new_tokens,
        "emulate_prefill_ms": args.emulate_prefill_ms, "emulate_step_ms": args.emulate_step_ms,
        "engine": engine_name, "batch_invariant": args.batch_invariant,
        "kv_slots": info.limits.kv_slots, "kv_tokens_per_slot": info.limits.kv_tokens_per_slot,
        "kv_layout": args.kv_layout, "kv_arena_positions": arena_positions,
        "gil_switch_interval_ms": args.gil_switch_interval_ms,
        "published_cost_model": dataclasses.asdict(info.cloud_cost),
        "answers_identical": identical,
        "answers_agreeing_with_target_only_N1": agreement,
        "preprocess_frames_ms": preprocess_ms,
        "throughput_vs_one_at_a_time": {
            f"{lv['mode']}@{lv['concurrency']}": round(float(lv["tokens_per_s"]) / base, 2)  # type: ignore[arg-type]
            for lv in levels
        },
        "levels": [{**{k: v for k, v in lv.items() if k != "answers"},
                    "agreeing_with_target_only_N1": _agreement(truths, [lv])}
                   for lv in levels],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    paced = f"-paced{args.emulate_prefill_ms:g}-{args.emulate_step_ms:g}" if (
        args.emulate_prefill_ms or args.emulate_step_ms) else ""
    tag = (f"-{args.model}" if args.model != "toy" else "") + (
        f"-{args.engine}" if args.engine != "auto" else "")
    out = args.out or RESULTS / f"capacity-{args.device.replace(':', '')}{tag}{paced}.json"
    write_result(out, result, indent=2)
    print(json.dumps(result["throughput_vs_one_at_a_time"], indent=2))
    print(f"answers identical across N and modes: {identical} (agreeing with target-only "
          f"N=1: {agreement:.1%}); wrote {out}")
    return 0 if identical or not strict else 1


def _preprocess_ms(target: TargetModel, req: OpenRequest) -> float:
    """Median ms of the cloud's CPU frame preprocessing (decode + CLIP) for one request."""
    assert req.frames is not None
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        target.preprocess_frames(req.frames)
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 2)


def _agreement(truths: list[list[int]], levels: list[dict[str, object]]) -> float:
    """Fraction of all answers, over every level, equal to the N=1 target-only answer."""
    same = total = 0
    for level in levels:
        answers = level["answers"]
        assert isinstance(answers, list)
        same += sum(a == t for a, t in zip(answers, truths, strict=True))
        total += len(answers)
    return round(same / max(1, total), 4)


def server_gap_rows(result: dict[str, object]) -> list[str]:
    """README rows of a run: per level, the in-server step against the device's time
    for the engine call (CUDA events), and how many sessions KV held at once."""
    rows = []
    levels = result["levels"]
    assert isinstance(levels, list)
    for lv in levels:
        mode = "target-only" if lv["mode"] == "target_only" else "oracle edge"
        ratio = lv["in_server_step_ms"] / lv["engine_device_ms_per_step"]
        rows.append(
            f"| {mode} | {lv['concurrency']} | {lv['tokens_per_s']} | {lv['ttft_p50_ms']:.0f} | "
            f"{lv['in_server_step_ms']:.2f} | {lv['engine_device_ms_per_step']:.2f} | "
            f"{ratio:.2f} | {lv['max_sessions_in_a_step']} | {lv['kv_queue_waits']} |")
    return rows


def _row(level: dict[str, object]) -> str:
    return (f"{level['mode']:>28} N={level['concurrency']:>3}: {level['tokens_per_s']:>8} tok/s, "
            f"p50 {level['latency_p50_s']} s, p99 {level['latency_p99_s']} s, "
            f"ttft {level['ttft_p50_ms']} ms (server {level['server_ttft_p50_ms']}, prefill "
            f"{level['prefill_ms_mean']} + wait {level['prefill_wait_ms_mean']}), "
            f"{level['ms_per_token_p50']} ms/token, step {level['in_server_step_ms']} ms, "
            f"(device {level['engine_device_ms_per_step']} ms), "
            f"{level['tokens_per_target_step']} tok/step, at most "
            f"{level['max_sessions_in_a_step']} sessions a step, {level['kv_queue_waits']} "
            f"waited for KV, batches {level['batch_size_histogram']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="toy",
                        help="toy, a model directory, or full-size-random (the 7B "
                             "architecture with random weights, built on --device)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--alpha", type=float, default=0.8)
    parser.add_argument("--draft-k", type=int, default=4)
    parser.add_argument("--kv-cache-gb", type=float, default=None)
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="positions per KV slot (default: the server's, prompt + 256 "
                             "question tokens + the answer cap)")
    parser.add_argument("--engine", choices=["auto", "static", "hf"], default="auto")
    parser.add_argument("--kv-layout", choices=["by-length", "slots"], default="by-length",
                        help="the server's --kv-layout (by-length: the static engine only)")
    parser.add_argument("--gil-switch-interval-ms", type=float,
                        default=CloudSettings().gil_switch_interval_ms,
                        help="the server's --gil-switch-interval-ms (0: Python's 5 ms)")
    parser.add_argument("--batch-invariant", action="store_true",
                        help="the cloud's --batch-invariant: answers at every N should then "
                             "equal the N = 1 target-only ones bitwise")
    parser.add_argument("--calibrate", action="store_true",
                        help="calibrate the cost model on this engine and record what "
                             "GetServerInfo publishes")
    parser.add_argument("--out", type=Path, default=None,
                        help="result file (default: benchmarks/results/capacity-<device>"
                             "[-<model>][-<engine>][-paced<P>-<S>].json)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--emulate-prefill-ms", type=float, default=0.0,
                        help="pace each prefill call to at least this (PacedEngine)")
    parser.add_argument("--emulate-step-ms", type=float, default=0.0,
                        help="pace each batched step to at least this, whatever the batch: "
                             "rehearses a bandwidth-bound GPU engine whose step cost is flat in B")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
