"""What a chunked prefill costs on the static engine, chunk by chunk (issue 23).

    python -m benchmarks.probe_chunked_prefill [--out DIR]     # on the GPU machine

Builds the full-size random target, then times, for one ~2.1k-token video prompt: the
whole prefill; the prompt's embeddings (video tower + projector, once per prompt); and
the same prompt prefilled in chunks of 64 .. 2,048 tokens (each chunk's call, and their
sum); then one 16-session decode step alone and followed by a 512-token chunk, the
scheduler's iteration with chunking on. A profile of one continuation chunk (start > 0)
lists its costliest kernels, which says whether its masked attention runs a fused
kernel. Medians of ``--repeats``; writes ``chunked_prefill_<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.engine_agreement import QUESTION, pixels
from benchmarks.engine_prefill import fill_slots
from benchmarks.stamp import write_result
from eventspec.cloud.engine.base import PrefillChunk, PrefillRequest
from eventspec.cloud.engine.static.build import (
    build_static_engine,
    kv_bytes_per_slot,
    static_kv_plan,
)
from eventspec.shared.node.static.batch import StepBatch

CHUNKS = (64, 256, 512, 1024, 2048)


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median ms of ``fn`` (synchronised), after one untimed call."""
    fn()
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-seq-len", type=int, default=2880)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    from tests.support.fullsize import build_full_target

    target = build_full_target("cuda")
    slots = 17
    kv = static_kv_plan(target, kv_cache_bytes=(slots + 1) * kv_bytes_per_slot(
        target, args.max_seq_len), max_seq_len=args.max_seq_len)
    engine = build_static_engine(target, kv)
    ids = target.build_prompt_ids(QUESTION)
    request = PrefillRequest(0, ids, pixels(target, 0))
    n = len(ids)
    result: dict[str, object] = {"device": torch.cuda.get_device_name(), "prompt_tokens": n}
    result["whole_prefill_ms"] = timed(lambda: engine.prefill([request]), args.repeats)
    result["prompt_embeds_ms"] = timed(lambda: engine.prompt_embeds(request, 0), args.repeats)
    embeds = engine.prompt_embeds(request, 0)  # [L, H]

    def chunked(size: int) -> list[float]:
        """Each chunk's ms, prefilling the whole prompt in ``size``-token pieces."""
        engine.free(0)
        times = []
        for start in range(0, n, size):
            piece = PrefillChunk(0, start, embeds[start : start + size])
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            engine.prefill_chunks([piece])
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        return times

    per_size = {}
    for size in CHUNKS:
        chunked(size)  # warm
        runs = [chunked(size) for _ in range(args.repeats)]
        per_size[str(size)] = {
            "chunks": len(runs[0]),
            "total_ms": statistics.median(sum(r) for r in runs),
            "first_chunk_ms": statistics.median(r[0] for r in runs),
            "later_chunk_ms_median": statistics.median(
                statistics.median(r[1:]) for r in runs) if len(runs[0]) > 1 else None,
        }
        print(size, per_size[str(size)], flush=True)
    result["chunked"] = per_size
    engine.prefill([request])
    fill_slots(engine, 16)
    step = StepBatch(tuple(range(16)), (n,) * 16, (1,) * 16,
                     torch.ones(16, dtype=torch.long, device="cuda"))
    result["step_b16_ms"] = timed(lambda: engine.step(step), args.repeats)
    engine.prefill([PrefillRequest(16, ids, pixels(target, 0))])

    def iteration() -> None:
        engine.step(step)
        engine.free(16)
        engine.prefill_chunks([PrefillChunk(16, 0, embeds[:512])])
        engine.prefill_chunks([PrefillChunk(16, 512, embeds[512:1024])])

    result["step_b16_plus_two_512_chunks_ms"] = timed(iteration, args.repeats)
    engine.free(16)
    engine.prefill_chunks([PrefillChunk(16, 0, embeds[:1024])])
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        engine.prefill_chunks([PrefillChunk(16, 1024, embeds[1024:1536])])
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)
    print(table)
    result["continuation_chunk_profile"] = table
    print(json.dumps({k: v for k, v in result.items() if k != "continuation_chunk_profile"},
                     indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    name = result["device"]
    assert isinstance(name, str)
    write_result(args.out / f"chunked_prefill_{name.split()[1].lower()}.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
