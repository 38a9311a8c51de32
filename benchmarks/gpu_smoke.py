"""Full-size Video-LLaVA-7B smoke run on a GPU: random weights, bf16, the real server.

Builds the 7B architecture from config (CLIP ViT-L/14-224 video tower, LLaMA-7B text
model, vocab 32064) with random weights, then:

1. times the engine directly: prefill of 8 frames + prompt, and verify steps with
   k = 0, 8 and 32 drafts (1, 9 and 33 tokens per forward);
2. starts the real ``VerifierServer`` in-process on port 0 with that target and sends
   one request with 8 frames and 32 drafts written right after Open, so they arrive
   during the prefill;
3. prints one JSON object (and writes it to $OUT/gpu_smoke.json when OUT is set).

Timing does not depend on weight values. The tokenizer is the tiny one (its special
ids are placed at 512/513); only sizes matter for timing.

    python -m benchmarks.gpu_smoke --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.stamp import write_result
from eventspec.cloud.config import CloudSettings
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.hf import HFEngine
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel
from eventspec.shared.contract.types import ServerLimits
from eventspec.shared.node.static.batch import StepBatch
from tests.support import cloud_harness as h
from tests.support.fullsize import build_full_target


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_engine(target: TargetModel, repeats: int) -> dict[str, float]:
    """Prefill and single-session steps through the batched engine API (slot 0)."""
    engine = HFEngine(target, num_slots=1)
    g = target.geometry
    pix = torch.randn(1, g.num_frames, 3, g.image_size, g.image_size, device=target.device,
                      dtype=target.dtype)
    ids = target.build_prompt_ids("What is moving in the scene, and which way does it go?")
    prefill = []
    for _ in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        engine.prefill([PrefillRequest(0, ids, pixel_values_videos=pix)])
        sync()
        prefill.append((time.perf_counter() - t0) * 1e3)
    out = {"prompt_tokens": float(len(ids)), "prefill_ms": statistics.median(prefill[1:])}
    for k in (0, 8, 32):
        batch = StepBatch((0,), (len(ids),), (k + 1,),
                          torch.full((k + 1,), 5, dtype=torch.long, device=target.device))
        times = []
        for _ in range(repeats + 1):
            sync()
            t0 = time.perf_counter()
            engine.step(batch)  # rolls back to the prompt implicitly (start position)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        out[f"step_k{k}_ms"] = statistics.median(times[1:])
    engine.free(0)
    return out


async def one_request(target: TargetModel) -> dict[str, object]:
    settings = replace(CloudSettings(), port=0, device=str(target.device),
                       profile_path=Path("/tmp/eventspec-gpu-profile.msgpack"),
                       limits=replace(ServerLimits(), max_sessions=2))
    server = VerifierServer(settings, target=target)
    t0 = time.perf_counter()
    await server.start()
    warm_s = time.perf_counter() - t0
    frames = h.make_frames(1, size=256)
    try:
        out = await h.run_generate(
            server.port, h.open_msg("What is moving?", frames, max_new_tokens=48),
            hidden=[100 + i for i in range(32)], timeout=300,
        )
    finally:
        await server.stop(0)
    s = out.done.stats
    assert server.runtime is not None
    cost = server.runtime.info.cloud_cost
    return {
        "warm_up_s": round(warm_s, 2),
        "calibrated_cost": cost.__dict__,
        "new_tokens": s.new_tokens,
        "hidden_drafted": s.hidden_drafted,
        "hidden_accepted": s.hidden_accepted,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "target_steps": s.target_steps,
        "ttft_ms": round(s.ttft_ms, 2),
        "total_ms": round(s.total_ms, 2),
        "stage_ms": {k: round(v, 2) for k, v in s.stage_ms.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    target = build_full_target(args.device, dtype)
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "build_s": round(time.perf_counter() - t0, 1),
        "visual_tokens": target.geometry.num_frames * target.geometry.tokens_per_frame,
    }
    result["engine"] = {k: round(v, 2) for k, v in time_engine(target, args.repeats).items()}
    result["request"] = asyncio.run(one_request(target))
    if torch.cuda.is_available():
        result["peak_gpu_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(json.dumps(result, indent=2))
    if os.environ.get("OUT"):
        write_result(Path(os.environ["OUT"], "gpu_smoke.json"), result, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
