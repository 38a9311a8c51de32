"""Load on one verifier: open-loop Poisson arrivals, whole vs chunked prefill, and a clip
asked about several times with and without prefix reuse (issue 23).

``bench_capacity.py`` is closed-loop (N clients, each asking again as soon as it is
answered), which hides what a burst of arrivals does to the sessions already decoding.
Here requests arrive at a fixed mean rate whatever the server does, as users do: each
request's arrival time is drawn from a Poisson process (seeded), and every request is
target-only (no drafts: this measures the server's scheduling, not speculation).

For every server configuration (``--configs``: a name, ``--prefill-chunk`` and
``--prefix-cache-gb``; each a fresh in-process ``VerifierServer`` over real gRPC on the
same target), every answer length and every rate it reports:

- TTFT p50/p99 (client: Open written to first Commit read), split by prefix-cache hit
  and miss where the cache is on;
- inter-token latency p50/p99 (the gaps between successive Commits, per token);
- goodput (answer tokens over the wall time from the first arrival to the last Done);
- whether the level meets the SLO (``--slo-ttft-ms`` on TTFT p99 and ``--slo-itl-ms`` on
  ITL p99), and per configuration the highest rate that does (its capacity);
- the in-server step (engine + sampler + the loop's own work) over the engine's step,
  and the share of wall time spent in prefill calls, from the scheduler's counters;
- the steps by kind (``step_kinds``: plain, a riding piece, a tower, several prompts'
  pieces, a prompt's last piece, eager, after a prefill call, after a failed mixed
  step; ``eventspec.cloud.scheduling.step_kinds``): per kind its steps, wall and device
  time and the gaps between step completions that it ended (one per session), with
  p50/p90/p99, and how many of those gaps are in the all-kinds p99 tail: which steps
  make the ITL p99. Logged in one line per level.

How long a level lasts matters: ``--requests`` over the rate is the seconds of
arrivals, and a short level ends before the queue it would build has built. On an H200
at 8 requests/s, 48 requests (6 s) met the SLO under every piece rule tried and 192
(24 s, the same arrivals and 144 more) under none (``docs/results/load-gpu.md``, "A
longer run"). A capacity claim needs a level long enough that its TTFT stops growing:
``ttft_growth`` (the later half's TTFT p50 over the earlier half's, the ``TTFT x``
column) says whether it did.

Requests cycle through ``--clips`` clips, ``--questions-per-clip`` questions each,
round-robin (a clip's next question arrives after every other clip's), so with the
prefix cache on every question after a clip's first can hit. Greedy answers must be
identical across configurations (chunking and reuse are lossless); in float32 the
script exits 1 otherwise.

    python -m benchmarks.bench_load --rates 1 2 4 --requests 24 --answer-tokens 32 \\
        --configs whole:off:0 chunked:16:0 reuse:16:0.05 --engine static

On the GPU machine (full size, random weights): ``--model full-size-random --device
cuda --dtype bfloat16 --max-seq-len 2880 --answer-tokens 128 512 --configs whole:off:0
chunked:auto:0 reuse:auto:8``. Writes ``benchmarks/results/load-<device>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from grpc import aio

from benchmarks.load_report import kinds_line, plot
from benchmarks.stamp import write_result
from eventspec.cloud.config import CloudSettings
from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy
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
SEED0 = EVAL_SEED_MIN + 11000


#: ``--configs``' options after the GiB.
OPTIONS = frozenset({"apart", "eager", "thaw", "inline"})


@dataclass(frozen=True)
class Config:
    """One server configuration: ``NAME:PREFILL_CHUNK:PREFIX_CACHE_GB[:OPTION...]``;
    options: ``apart``, chunks run in calls of their own (``--mixed-steps off``);
    ``eager``, inside the step but without its CUDA graphs (the engine's mixed-step
    graphs dropped after warm-up: mixed steps at exact shapes, as before they were
    graphed); ``thaw``, ``--gc-freeze off``; ``inline``, ``--towers-ahead off`` (a
    prompt's tower inside the step that carries its first piece)."""

    name: str
    prefill_chunk: str
    prefix_cache_gb: float
    mixed_steps: bool = True
    graphed: bool = True
    gc_freeze: bool = True
    towers_ahead: bool = True

    @classmethod
    def parse(cls, text: str) -> Config:
        """``PREFILL_CHUNK`` may be ``slack:R`` or ``slack:R:PACE`` (``n:slack:1.5:0``,
        ``n:slack:2:200:0``): after ``slack``, the last number before the options is the
        GiB and those before it R and the pace."""
        try:
            name, chunk, *more = text.split(":")
            for _ in range(2 if chunk.lower() == "slack" else 0):
                if len(more) >= 2 and more[1] not in OPTIONS:
                    chunk, more = f"{chunk}:{more[0]}", more[1:]
            gb, *rest = more
            if not set(rest) <= OPTIONS or len(set(rest)) != len(rest):
                raise ValueError(text)
            ChunkPolicy.parse(chunk)
            return cls(name, chunk, float(gb), mixed_steps="apart" not in rest,
                       graphed="eager" not in rest, gc_freeze="thaw" not in rest,
                       towers_ahead="inline" not in rest)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--configs: {text!r} is not NAME:PREFILL_CHUNK:PREFIX_CACHE_GB[:OPTION...] "
                "(PREFILL_CHUNK: off, auto, N, slack, slack:R or slack:R:PACE; options: "
                f"{', '.join(sorted(OPTIONS))})") from None


def workload(n: int, clips: int, per_clip: int, max_new: int) -> list[OpenRequest]:
    """``n`` requests over ``clips`` toy clips, ``per_clip`` questions each, round-robin
    (clip 0 q0, clip 1 q0, ..., clip 0 q1, ...); frames as JPEG like a real edge sends."""
    pool: list[list[tuple[str, tuple[bytes, ...]]]] = []
    for c in range(clips):
        scene = sample_scene(SEED0 + c)
        frames = tuple(encode_jpeg(f, 90) for f in clip_frames(scene))
        questions = [qa.question for qa in all_questions(scene)]
        pool.append([(questions[q % len(questions)]
                      + (f" ({q})" if q >= len(questions) else ""), frames)
                     for q in range(per_clip)])
    order = [pool[c][q] for q in range(per_clip) for c in range(clips)]
    out = []
    for i in range(n):
        question, frames = order[i % len(order)]
        out.append(OpenRequest(request_id=f"load-{i}", question=question,
                               generation=GenerationSettings(max_new_tokens=max_new),
                               frames=frames, speculative=False))
    return out


async def one_request(port: int, req: OpenRequest) -> dict[str, Any]:
    """One target-only Generate: TTFT, the gaps between Commits per token, the answer."""
    t0 = time.perf_counter()
    async with aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = verifier_pb2_grpc.VerifierStub(ch).Generate(timeout=600)
        await call.write(verifier_pb2.EdgeMessage(open=convert_verifier.open_to_pb(req)))
        ttft, last, gaps = 0.0, 0.0, []
        while True:
            msg = await call.read()
            if msg is aio.EOF:
                raise RuntimeError(f"{req.request_id}: the stream ended without Done")
            event = convert_verifier.cloud_message_from_pb(msg)
            now = time.perf_counter()
            if isinstance(event, DoneEvent):
                break
            if isinstance(event, CommitEvent):
                if ttft:
                    gaps += [(now - last) * 1e3 / len(event.token_ids)] * len(event.token_ids)
                else:
                    ttft = now - t0
                last = now
        await call.done_writing()
    return {"ttft_ms": ttft * 1e3, "itl_ms": gaps, "ids": list(event.token_ids),
            "done_at": time.perf_counter(), "prefix_cache": event.stats.prefix_cache}


class GcPauses:
    """The cyclic collector's passes while a level runs, timed from its callbacks: how
    many of each generation, and their pauses (they stop every thread, the engine
    loop's included)."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.pauses_ms: list[float] = []
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        self.passes[info["generation"]] += 1
        self.pauses_ms.append((time.perf_counter() - self._t0) * 1e3)

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def report(self) -> dict[str, Any]:
        return {"gc_passes_by_generation": self.passes,
                "gc_pause_ms_max": max(self.pauses_ms, default=0.0),
                "gc_pause_ms_total": sum(self.pauses_ms)}


def ttft_growth(ttft_ms: Sequence[float]) -> float | None:
    """The TTFT p50 of the later half of a level's requests (in arrival order) over the
    earlier half's: about 1 when the level is steady, and above it while a queue builds
    (then the level's SLO verdict says more of its length than of its rate). None with
    fewer than two requests or an earlier median of 0."""
    half = len(ttft_ms) // 2
    if half == 0:
        return None
    early = float(np.median(ttft_ms[:half]))
    return float(np.median(ttft_ms[half:])) / early if early > 0 else None


async def run_rate(server: VerifierServer, reqs: list[OpenRequest], rate: float,
                   seed: int, slo: tuple[float, float]) -> dict[str, Any]:
    """Every request at its Poisson arrival time; the level's measurements."""
    assert server.runtime is not None
    stats = server.runtime.scheduler.stats
    before = (stats.steps, stats.engine_ms, stats.sampler_ms, stats.overhead_ms,
              stats.prefill_ms, stats.prefills, stats.prefill_chunks,
              stats.engine_device_ms, stats.device_timed_steps)
    kinds_before = stats.kinds.copy()
    rng = random.Random(seed)
    arrivals = np.cumsum([rng.expovariate(rate) for _ in reqs])
    t0 = time.perf_counter()

    async def at(delay: float, req: OpenRequest) -> dict[str, Any]:
        await asyncio.sleep(max(0.0, t0 + delay - time.perf_counter()))
        return await one_request(server.port, req)

    with GcPauses() as gc_pauses:
        rows = await asyncio.gather(*(at(float(d), r)
                                      for d, r in zip(arrivals, reqs, strict=True)))
    wall = max(r["done_at"] for r in rows) - t0
    steps = max(1, stats.steps - before[0])
    # In-server: the loop's host time per step (engine call, sampler, its own work). The
    # engine: the device's time on the step (CUDA events; on CUDA the host's time
    # around the call is only its launch).
    in_server_ms = (stats.engine_ms - before[1]) + (stats.sampler_ms - before[2]) \
        + (stats.overhead_ms - before[3])
    timed = stats.device_timed_steps - before[8]
    engine_step = (stats.engine_device_ms - before[7]) / timed if timed else None
    ttft = np.array([r["ttft_ms"] for r in rows])
    itl = np.array([g for r in rows for g in r["itl_ms"]] or [0.0])
    tokens = sum(len(r["ids"]) for r in rows)
    level = {
        "rate_per_s": rate, "requests": len(rows), "wall_s": wall,
        "goodput_tok_s": tokens / wall,
        "ttft_ms_p50": float(np.median(ttft)), "ttft_ms_p99": float(np.quantile(ttft, 0.99)),
        "ttft_growth": ttft_growth(list(ttft)),  # rows are in arrival order
        "itl_ms_p50": float(np.median(itl)), "itl_ms_p99": float(np.quantile(itl, 0.99)),
        "in_server_step_ms": in_server_ms / steps, "engine_step_ms": engine_step,
        "in_server_over_engine": in_server_ms / steps / engine_step if engine_step else None,
        "prefill_share_of_wall": (stats.prefill_ms - before[4]) / 1e3 / wall,
        # Pieces per prompt with chunking on (0 without): the chunk size the rule chose.
        "chunks_per_prefill": (stats.prefill_chunks - before[6])
        / max(1, stats.prefills - before[5]),
        "answers": [r["ids"] for r in rows],
        "step_kinds": stats.kinds.since(kinds_before).summary(),
        **gc_pauses.report(),
    }
    level["itl_p99_over_p50"] = (level["itl_ms_p99"] / level["itl_ms_p50"]
                                 if level["itl_ms_p50"] else None)
    level["meets_slo"] = bool(level["ttft_ms_p99"] <= slo[0] and level["itl_ms_p99"] <= slo[1])
    for verdict, count in (("hit", "prefix_hits"), ("miss", "prefix_misses")):
        mine = [r["ttft_ms"] for r in rows if r["prefix_cache"] == verdict]
        level[count] = len(mine)
        level[f"ttft_ms_p50_{verdict}"] = float(np.median(mine)) if mine else None
    return level


def release(server: VerifierServer) -> None:
    """Drop a stopped server's engine and KV cache, so the next configuration's server
    gets the card's memory (on an H200 the second one ran out of it)."""
    server.runtime = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        logging.getLogger("bench_load").warning(
            "after releasing a server: %.1f GiB allocated on the GPU",
            torch.cuda.memory_allocated() / 2**30)


async def run_config(args: argparse.Namespace, target: TargetModel, config: Config
                     ) -> dict[str, Any]:
    settings = replace(
        CloudSettings(), model=args.model, device=args.device, dtype=args.dtype, port=0,
        engine=args.engine, kv_cache_gb=args.kv_cache_gb, max_seq_len=args.max_seq_len,
        prefill_chunk=config.prefill_chunk, prefix_cache_gb=config.prefix_cache_gb,
        mixed_steps=config.mixed_steps, gc_freeze=config.gc_freeze,
        towers_ahead=config.towers_ahead,
        limits=replace(ServerLimits(), max_sessions=args.max_sessions,
                       max_new_tokens=max(512, *args.answer_tokens)),
        recalibrate=args.calibrate, profile_path=RESULTS / ".load-profile.msgpack")
    server = VerifierServer(settings, target=target, cost=None if args.calibrate else TEST_COST)
    await server.start()
    if not config.graphed and server.runtime is not None:
        getattr(server.runtime.scheduler.engine, "mixed_graphs", {}).clear()
    try:
        await run_rate(server, workload(2, 1, 1, 4), 100.0, args.seed, (1e9, 1e9))  # warm-up
        gc_tracked = len(gc.get_objects())
        t_gc = time.perf_counter()
        gc.collect()  # what one full pass of the collector costs this warm process
        full_gc_ms = (time.perf_counter() - t_gc) * 1e3
        levels = []
        for tokens in args.answer_tokens:
            reqs = workload(args.requests, args.clips, args.questions_per_clip, tokens)
            for rate in args.rates:
                # A fresh prefix cache for every level: each starts cold.
                if server.runtime is not None and server.runtime.scheduler.prefix_cache:
                    server.runtime.scheduler.prefix_cache.clear()
                level = {"answer_tokens": tokens, **await run_rate(
                    server, reqs, rate, args.seed, (args.slo_ttft_ms, args.slo_itl_ms))}
                levels.append(level)
                logging.getLogger("bench_load").warning(
                    "%s %d tokens %g/s: TTFT p99 %.0f ms, ITL p50/p99 %.1f/%.1f ms, %.1f tok/s",
                    config.name, tokens, rate, level["ttft_ms_p99"], level["itl_ms_p50"],
                    level["itl_ms_p99"], level["goodput_tok_s"])
                logging.getLogger("bench_load").warning(
                    "%s %d tokens %g/s: %s", config.name, tokens, rate,
                    kinds_line(level["step_kinds"]))
        assert server.runtime is not None
        info = server.runtime.info
    finally:
        await server.stop(0)
        release(server)
    capacity = {str(t): max([lv["rate_per_s"] for lv in levels
                             if lv["answer_tokens"] == t and lv["meets_slo"]], default=0.0)
                for t in args.answer_tokens}
    return {"config": config.__dict__, "kv_slots": info.limits.kv_slots,
            "full_gc_pass_ms": full_gc_ms, "gc_tracked_objects": gc_tracked,
            "kv_tokens_per_slot": info.limits.kv_tokens_per_slot,
            "capacity_at_slo_per_s": capacity, "levels": levels}


async def main_async(args: argparse.Namespace,
                     save_partial: Callable[[dict[str, Any]], None] | None = None
                     ) -> dict[str, Any]:
    """Every configuration in turn; ``save_partial`` gets the results so far after each
    (a run cut at its time limit keeps its configurations)."""
    torch.set_num_threads(args.threads)
    if args.model == "full-size-random":
        from tests.support.fullsize import build_full_target

        target = build_full_target(args.device, getattr(torch, args.dtype))
    else:
        target = load_target_for(replace(CloudSettings(), model=args.model, device=args.device,
                                         dtype=args.dtype))
    runs: list[dict[str, Any]] = []
    for c in args.configs:
        runs.append(await run_config(args, target, c))
        if save_partial is not None:
            save_partial(header(args, target, runs, None) | {"partial": True})
    first = [lv["answers"] for lv in runs[0]["levels"]]
    identical = all([lv["answers"] for lv in r["levels"]] == first for r in runs)
    return header(args, target, runs, identical)


def header(args: argparse.Namespace, target: TargetModel, runs: list[dict[str, Any]],
           identical: bool | None) -> dict[str, Any]:
    """The results JSON of the configurations run so far (answers left out)."""
    runs = [r | {"levels": [{k: v for k, v in lv.items() if k != "answers"}
                            for lv in r["levels"]]} for r in runs]
    return {
        "what": "open-loop Poisson arrivals of target-only requests through one in-process "
                "verifier over gRPC, per server configuration (issue 23)",
        "command": "python -m benchmarks.bench_load " + " ".join(args.argv),
        "model": target.model_id, "device": args.device, "dtype": args.dtype,
        "slo": {"ttft_p99_ms": args.slo_ttft_ms, "itl_p99_ms": args.slo_itl_ms},
        "clips": args.clips, "questions_per_clip": args.questions_per_clip,
        "answers_identical_across_configs": identical, "configs": runs,
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"{'config':>10} {'tokens':>6} {'rate':>5} {'TTFT p50':>8} {'p99':>7} "
             f"{'TTFT x':>6} {'ITL p50':>7} {'p99':>6} {'tok/s':>7} {'srv/eng':>7} {'hits':>4} SLO"]
    for run in result["configs"]:
        for lv in run["levels"]:
            ratio = lv.get("in_server_over_engine")  # absent: a superseded launch-timed run
            growth = lv.get("ttft_growth")  # absent: a run before it was reported
            lines.append(
                f"{run['config']['name']:>10} {lv['answer_tokens']:>6} {lv['rate_per_s']:>5g} "
                f"{lv['ttft_ms_p50']:>8.0f} {lv['ttft_ms_p99']:>7.0f} "
                f"{'–' if growth is None else f'{growth:.2f}':>6} {lv['itl_ms_p50']:>7.1f} "
                f"{lv['itl_ms_p99']:>6.1f} {lv['goodput_tok_s']:>7.1f} "
                f"{'–' if ratio is None else f'{ratio:.2f}':>7} {lv['prefix_hits']:>4} "
                f"{'yes' if lv['meets_slo'] else 'no'}")
    return "\n".join(lines)


def readme_rows(result: dict[str, Any]) -> list[str]:
    """The README's table rows (``tests/unit/test_readme.py`` checks them against the
    committed JSON)."""
    rows = []
    for run in result["configs"]:
        for lv in run["levels"]:
            hits = (f"{lv['prefix_hits']} of {lv['requests']}"
                    if lv["prefix_hits"] or lv["prefix_misses"] else "–")
            rows.append(
                f"| {run['config']['name']} | {lv['rate_per_s']:g} | "
                f"{lv['ttft_ms_p50']:.0f} / {lv['ttft_ms_p99']:.0f} | "
                f"{lv['itl_ms_p50']:.1f} / {lv['itl_ms_p99']:.1f} | "
                f"{lv['goodput_tok_s']:.1f} | {hits} |")
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_load",
                                description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--model", default="toy",
                   help="toy, a model directory, or full-size-random (GPU)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--engine", choices=["auto", "static", "hf"], default="static")
    p.add_argument("--configs", type=Config.parse, nargs="+",
                   default=[Config("whole", "off", 0.0), Config("chunked", "auto", 0.0),
                            Config("reuse", "auto", 0.05)],
                   help="NAME:PREFILL_CHUNK:PREFIX_CACHE_GB, one server each")
    p.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0],
                   help="mean arrivals per second")
    p.add_argument("--requests", type=int, default=24, help="per level")
    p.add_argument("--answer-tokens", type=int, nargs="+", default=[32])
    p.add_argument("--clips", type=int, default=6)
    p.add_argument("--questions-per-clip", type=int, default=4)
    p.add_argument("--max-sessions", type=int, default=64)
    p.add_argument("--kv-cache-gb", type=float, default=None)
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    p.add_argument("--slo-itl-ms", type=float, default=50.0)
    p.add_argument("--calibrate", action="store_true",
                   help="calibrate the cost model (the auto chunk size reads it) instead "
                        "of the test harness's fixed costs")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None,
                   help="default: benchmarks/results/load-<device>.json")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    if min(args.rates) <= 0 or args.requests < 1 or args.clips < 1 \
            or args.questions_per_clip < 1:
        print("--rates, --requests, --clips and --questions-per-clip must be > 0",
              file=sys.stderr)
        return 2
    out = args.out or RESULTS / f"load-{args.device.replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(result: dict[str, Any]) -> None:
        write_result(out, result)

    result = asyncio.run(main_async(args, save))
    save(result)
    print(table(result))
    print(plot(result, out.with_suffix(".png")))
    print(f"answers identical across configurations: "
          f"{result['answers_identical_across_configs']}; wrote {out}")
    strict = args.dtype == "float32"
    return 0 if result["answers_identical_across_configs"] or not strict else 1


if __name__ == "__main__":
    sys.exit(main())
