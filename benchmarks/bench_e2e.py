"""The end-to-end benchmark (issue 26): real processes, a delayed link, N edges at once,
speculative vs target-only per request, and the reference model's prediction beside it.

The drafts come from the **oracle drafter** (``--draft-engine oracle``, benchmarks only,
and every output says so): it drafts the target-only answer of the same request, each
token wrong with probability 1 - α, at a given ms per token. So this measures what the
system makes of drafts of a known quality, not what EventGPT drafts.

Layout: one ``eventspec-cloud serve`` process (the toy target on CPU, paced with
``--emulate-prefill-ms/--emulate-step-ms``; or ``--cloud HOST:PORT``, a cloud started
elsewhere, e.g. full size on a GPU), N ``eventspec-edge serve`` processes each reaching
the cloud through its own :class:`~benchmarks.delay_proxy.DelayProxy` in this process
(RTT/2 each way), and N clients, one per edge, asking over gRPC at the same time.

1. An oracle edge that knows no answers, straight to the cloud, asks every question of
   the pool target-only; the token ids become the oracle's answers file (keyed by the
   question, so each question of the pool is unique: a repeated toy-world question gets
   a " (k)" suffix).
2. For each α: N edges start with the oracle at α (and ``--acceptance-prior α``). For
   each RTT the proxies are reshaped and every edge asks one pair, not counted, so its
   RTT estimate follows. For each N, clients 0..N-1 each ask ``--requests`` questions,
   speculative then target-only, concurrently.
3. Per point: the median and p10 of per-request speedup (client wall time of
   target-only ÷ speculative), the share of requests more than 3% slower than
   target-only, tokens per target step after the prefill ((new tokens - 1) / steps),
   the acceptance, and ``benchmarks.spec_model.simulate`` from the same run's inputs: the
   cloud's prefill and step costs (its advertised cost model; the paced values), the
   oracle's pace, the proxy's RTT, α, the median answer length, N as the batch, and the
   plans' draft depth; then achieved ÷ predicted (medians).

Greedy answers must be identical speculative vs target-only vs the answers file, or the
script exits 1. Writes ``benchmarks/results/e2e-cpu-rehearsal.json`` (``--out``) and a
PNG beside it when matplotlib is installed.

    python -m benchmarks.bench_e2e --alphas 0 0.8 --rtt-ms 1 20 --clients 1 4 \\
        --cloud-prefill-ms 200 --cloud-step-ms 30 --oracle-ms-per-token 5 \\
        --max-new-tokens 24 --requests 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from benchmarks.delay_proxy import DelayProxy, LinkShape
from benchmarks.e2e_report import plot, table
from benchmarks.spec_model import SpecInputs, cloud_step_cost, simulate
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.client.launch import Node, start_node, stop_node, wait_for_port
from eventspec.shared.contract.convert_verifier import server_info_from_pb
from eventspec.shared.contract.types import (
    AskSpec,
    FeatureMode,
    FinalEvent,
    GenerationSettings,
    Mode,
    ServerInfo,
)
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.toyworld.qa import all_questions
from eventspec.shared.toyworld.scenes import EVAL_SEED_MIN, sample_scene
from eventspec.shared.wire.health import wait_for_serving

log = logging.getLogger("benchmarks.bench_e2e")

RESULTS = Path(__file__).resolve().parent / "results"
LABEL = "oracle drafter: drafts the target-only answer, each token wrong w.p. 1 - alpha — " \
        "benchmarks only"
SEED0 = EVAL_SEED_MIN + 9000
SCENE_US = 1_000_000
NODE_START_S = 300.0
#: A request this much slower than target-only counts as slower.
SLOWER = 1.03


@dataclass(frozen=True)
class Question:
    """One request of the pool: the text (unique: the oracle's key) and its scene."""

    text: str
    scene: int

    def spec(self, mode: Mode, max_new: int,
             feature_mode: FeatureMode = FeatureMode.FRAMES) -> AskSpec:
        return AskSpec(self.text, mode=mode, feature_mode=feature_mode,
                       generation=GenerationSettings(max_new_tokens=max_new),
                       latest_ms=None, t0_us=self.scene * SCENE_US,
                       t1_us=(self.scene + 1) * SCENE_US)


def question_pool(n: int) -> list[Question]:
    """``n`` toy-world questions over consecutive scenes, made unique by a suffix."""
    out: list[Question] = []
    seen: set[str] = set()
    scene = 0
    while len(out) < n:
        for qa in all_questions(sample_scene(SEED0 + scene)):
            text = qa.question
            k = 1
            while text in seen:
                k += 1
                text = f"{qa.question} ({k})"
            seen.add(text)
            out.append(Question(text, scene))
            if len(out) == n:
                break
        scene += 1
    return out


# -- processes ----------------------------------------------------------------------------

@dataclass
class Nodes:
    """The processes this run started (stopped in reverse at the end)."""

    tmp: Path
    procs: list[Any]

    async def start(self, node: Node, name: str, args: Sequence[str],
                    random_cloud: Sequence[str] = ()) -> str:
        """Start ``node serve`` (or, with ``random_cloud``, ``benchmarks.serve_random``
        with those options, passing ``args`` on to its serve) and wait until it serves."""
        log_path, port_file = self.tmp / f"{name}.log", self.tmp / f"{name}.port"
        serve_args = ["--port", "0", "--port-file", str(port_file), *args]
        if random_cloud:
            with open(log_path, "wb") as out:
                proc: Any = subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.serve_random", *random_cloud, "--",
                     *serve_args], stdout=out, stderr=subprocess.STDOUT,
                    env=dict(os.environ, PYTHONUNBUFFERED="1"))
        else:
            proc = start_node(node, ["serve", *serve_args], log_path)
        self.procs.append(proc)
        port = await wait_for_port(proc, port_file, log_path, NODE_START_S)
        address = f"127.0.0.1:{port}"
        await wait_for_serving(address, timeout_s=NODE_START_S)
        return address

    def stop(self, count: int | None = None) -> None:
        """Stop the newest ``count`` processes (all by default)."""
        n = len(self.procs) if count is None else count
        for _ in range(n):
            stop_node(self.procs.pop())


def cloud_args(args: argparse.Namespace, max_clients: int) -> list[str]:
    out = ["--model", args.cloud_model, "--max-sessions", str(max_clients + 2),
           "--max-new-tokens", str(max(args.max_new_tokens, 16))]
    if args.cloud_prefill_ms > 0 or args.cloud_step_ms > 0:
        out += ["--emulate-prefill-ms", f"{args.cloud_prefill_ms:g}",
                "--emulate-step-ms", f"{args.cloud_step_ms:g}"]
    return out + list(args.cloud_args)


def edge_args(args: argparse.Namespace, cloud: str, answers: Path, alpha: float,
              profile: Path) -> list[str]:
    return ["--cloud", cloud, "--source", f"toy:{SEED0}-{SEED0 + args.scenes}",
            "--model", args.edge_model, "--draft-engine", "oracle",
            "--oracle-answers", str(answers),
            "--oracle-alpha", f"{alpha:g}", "--oracle-ms-per-token",
            f"{args.oracle_ms_per_token:g}", "--oracle-prefill-ms",
            f"{args.oracle_prefill_ms:g}", "--oracle-seed", str(args.seed),
            "--acceptance-prior", f"{alpha:g}", "--speculation", args.speculation,
            "--profile", str(profile), *args.edge_args]


async def server_info(address: str) -> ServerInfo:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await verifier_pb2_grpc.VerifierStub(channel).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=30)
    return server_info_from_pb(reply)


# -- asking -------------------------------------------------------------------------------

async def timed(client: EdgeClient, spec: AskSpec) -> tuple[FinalEvent, float]:
    t0 = time.perf_counter()
    final = await client.ask_final(spec)
    return final, (time.perf_counter() - t0) * 1e3


async def ask_pairs(address: str, questions: Sequence[Question], max_new: int,
                    client: int = 0) -> list[dict[str, Any]]:
    """Each question speculative and target-only on one edge: one row per question.

    Which mode goes first alternates with the question and the client, so that with
    several clients both modes meet the same load: with speculative always first, the
    clients' speculative requests arrived together and queued behind each other's
    prefills while their target-only requests came staggered (α = 0, 4 clients: 0.87x,
    although nothing was drafted)."""
    rows = []
    async with EdgeClient(address, timeout_s=300) as edge:
        for j, q in enumerate(questions):
            if (client + j) % 2 == 0:
                spec, spec_ms = await timed(edge, q.spec(Mode.SPECULATIVE, max_new))
                base, base_ms = await timed(edge, q.spec(Mode.TARGET_ONLY, max_new))
            else:
                base, base_ms = await timed(edge, q.spec(Mode.TARGET_ONLY, max_new))
                spec, spec_ms = await timed(edge, q.spec(Mode.SPECULATIVE, max_new))
            s = spec.stats
            rows.append({
                "question": q.text, "spec_ms": spec_ms, "target_ms": base_ms,
                "speedup": base_ms / spec_ms, "tokens": len(spec.token_ids),
                "spec_ids": list(spec.token_ids), "target_ids": list(base.token_ids),
                "drafted": s.drafted, "accepted": s.accepted, "steps": s.target_steps,
                "target_only_steps": base.stats.target_steps,
                "hidden_drafted": s.hidden_drafted, "hidden_accepted": s.hidden_accepted,
                "ttft_ms": s.ttft_ms, "target_ttft_ms": base.stats.ttft_ms,
                "speculated": bool(spec.plan and spec.plan.speculate),
                "lookahead": spec.plan.lookahead_tokens if spec.plan else 0,
                "hidden_budget": spec.plan.hidden_draft_budget if spec.plan else 0,
                "plan_prefill_ms": spec.plan.predicted_prefill_ms if spec.plan else 0.0,
            })
    return rows


async def precompute_answers(address: str, pool: Sequence[Question], max_new: int
                             ) -> dict[str, list[int]]:
    async with EdgeClient(address, timeout_s=300) as client:
        return {q.text: list((await client.ask_final(q.spec(Mode.TARGET_ONLY, max_new)))
                             .token_ids) for q in pool}


async def uplink_rows(address: str, question: Question, max_new: int, rate_mbit: float
                      ) -> list[dict[str, Any]]:
    """One speculative Ask per feature mode (frames; aligned features; auto) through an
    uplink of ``rate_mbit``: TTFT, the bytes sent, their time on the wire at that rate,
    and what the plan said of the aligned path."""
    rows = []
    async with EdgeClient(address, timeout_s=300) as client:
        for mode in (FeatureMode.FRAMES, FeatureMode.ALIGNED, FeatureMode.AUTO):
            final, total_ms = await timed(client, question.spec(Mode.SPECULATIVE, max_new, mode))
            s = final.stats
            rows.append({
                "rate_mbit": rate_mbit, "requested": mode.name.lower(),
                "feature_mode": final.feature_mode.name.lower() if final.feature_mode else None,
                "ttft_ms": s.ttft_ms, "total_ms": total_ms, "uplink_bytes": s.uplink_bytes,
                "wire_ms_at_rate": s.uplink_bytes * 8 / (rate_mbit * 1e6) * 1e3,
                "aligned_fits_uplink": bool(final.plan and final.plan.aligned_fits_uplink),
                "plan_prefill_ms": final.plan.predicted_prefill_ms if final.plan else None,
            })
    return rows


# -- one point ----------------------------------------------------------------------------

def summarise(rows: list[dict[str, Any]], *, alpha: float, rtt_ms: float, clients: int,
              args: argparse.Namespace, info: ServerInfo,
              answers: dict[str, list[int]]) -> dict[str, Any]:
    speedups = np.array([r["speedup"] for r in rows])
    drafted = sum(r["drafted"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    steps = sum(r["steps"] for r in rows)
    identical = all(r["spec_ids"] == r["target_ids"] == answers[r["question"]] for r in rows)
    tokens = int(statistics.median(r["tokens"] for r in rows))
    depth = int(statistics.median(r["lookahead"] for r in rows)) or 1
    cloud_prefill = statistics.median(r["plan_prefill_ms"] for r in rows) or args.cloud_prefill_ms
    inputs = SpecInputs(
        cloud_prefill_ms=cloud_prefill, step_cost=cloud_step_cost(info.cloud_cost),
        edge_prefill_ms=args.oracle_prefill_ms, draft_ms=max(args.oracle_ms_per_token, 1e-3),
        rtt_ms=rtt_ms, alpha=alpha, tokens=max(tokens, 1), depth=depth, width=depth,
        batch=clients)
    model = simulate(inputs, trials=args.trials, seed=args.seed)
    achieved = float(np.median(speedups))
    return {
        "alpha": alpha, "rtt_ms": rtt_ms, "clients": clients, "requests": len(rows),
        "identical": identical,
        "speedup_p50": achieved, "speedup_p10": float(np.quantile(speedups, 0.1)),
        "share_slower_3pct": float(np.mean(speedups < 1 / SLOWER)),
        "spec_ms_p50": statistics.median(r["spec_ms"] for r in rows),
        "target_ms_p50": statistics.median(r["target_ms"] for r in rows),
        # The stats count the prefill as a step; the model's τ does not.
        "tokens_per_step": (sum(r["tokens"] - 1 for r in rows) / (steps - len(rows))
                            if steps > len(rows) else None),
        "acceptance": accepted / drafted if drafted else None,
        "drafted": drafted, "accepted": accepted,
        "hidden_drafted": sum(r["hidden_drafted"] for r in rows),
        "hidden_accepted": sum(r["hidden_accepted"] for r in rows),
        # What the plans allowed to hide inside the cloud's prefill, against what was.
        "hidden_budget": sum(r["hidden_budget"] for r in rows),
        "plans_speculating": sum(r["speculated"] for r in rows),
        "model_inputs": {
            "cloud_prefill_ms": cloud_prefill, "cloud_cost": asdict(info.cloud_cost),
            "edge_prefill_ms": args.oracle_prefill_ms,
            "draft_ms": args.oracle_ms_per_token, "rtt_ms": rtt_ms, "alpha": alpha,
            "tokens": tokens, "depth": depth, "width": depth, "batch": clients,
        },
        "predicted": {k: getattr(model, k) for k in (
            "speedup", "speedup_p10", "speedup_p50", "tokens_per_step", "acceptance",
            "spec_ms", "target_ms")},
        "achieved_over_predicted": achieved / model.speedup_p50 if model.speedup_p50 else None,
    }


# -- the run ------------------------------------------------------------------------------

@contextlib.contextmanager
def scratch(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        yield Path(tmp)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    max_n = max(args.clients)
    pool = question_pool(max_n * args.requests)
    with scratch(args.logs) as tmp:
        nodes = Nodes(tmp, [])
        proxies: list[DelayProxy] = []
        try:
            random_cloud = (["--size", args.cloud_random] if args.cloud_random else [])
            cloud = args.cloud or await nodes.start("eventspec-cloud", "cloud",
                                                    cloud_args(args, max_n), random_cloud)
            info = await server_info(cloud)
            host, _, port = cloud.rpartition(":")
            answers_path = tmp / "answers.json"
            answers_path.write_text("{}")
            first = await nodes.start("eventspec-edge", "edge-answers", edge_args(
                args, cloud, answers_path, 1.0, tmp / "edge-answers.msgpack"))
            answers = await precompute_answers(first, pool, args.max_new_tokens)
            nodes.stop(1)
            answers_path.write_text(json.dumps(answers))
            for i in range(max_n):
                proxies.append(await DelayProxy((host, int(port)), seed=args.seed + i).start())
            points, rows_out, label = [], [], ""
            uplink: list[dict[str, Any]] = []
            for alpha in args.alphas:
                edges = await asyncio.gather(*(nodes.start(
                    "eventspec-edge", f"edge-a{alpha:g}-{i}",
                    edge_args(args, proxies[i].address, answers_path, alpha,
                              tmp / f"edge-{i}.msgpack")) for i in range(max_n)))
                async with EdgeClient(edges[0], timeout_s=30) as c:
                    label = (await c.status()).draft_engine
                for rtt in args.rtt_ms:
                    for p in proxies:
                        for d in ("up", "down"):
                            p.set_shape(d, LinkShape(delay_ms=rtt / 2))
                    await asyncio.gather(*(ask_pairs(e, pool[i:i + 1], args.max_new_tokens)
                                           for i, e in enumerate(edges)))  # not counted
                    for n in args.clients:
                        started = time.perf_counter()
                        per_client = await asyncio.gather(*(ask_pairs(
                            edges[i], pool[i * args.requests:(i + 1) * args.requests],
                            args.max_new_tokens, client=i) for i in range(n)))
                        rows = [r for rs in per_client for r in rs]
                        point = summarise(rows, alpha=alpha, rtt_ms=rtt, clients=n,
                                          args=args, info=info, answers=answers)
                        point["wall_s"] = time.perf_counter() - started
                        points.append(point)
                        rows_out += [{"alpha": alpha, "rtt_ms": rtt, "clients": n, **r}
                                     for r in rows]
                        log.info("alpha %g, RTT %g ms, N %d: %.3fx (model %.3fx), %s", alpha,
                                 rtt, n, point["speedup_p50"], point["predicted"]["speedup_p50"],
                                 "identical" if point["identical"] else "DIFFERENT")
                if alpha == args.alphas[-1]:
                    for rate in args.uplink_mbit:  # one edge, its proxy's uplink shaped
                        proxies[0].set_shape("up", LinkShape(
                            delay_ms=args.rtt_ms[0] / 2, rate_bytes_per_s=rate * 1e6 / 8))
                        uplink += await uplink_rows(edges[0], pool[0], args.max_new_tokens,
                                                    rate)
                nodes.stop(max_n)
        finally:
            for p in proxies:
                await p.stop()
            nodes.stop()
    return {
        "label": LABEL, "draft_engine": label,
        "benchmark": "e2e rehearsal: oracle drafter, real processes, delay proxies",
        "command": "python -m benchmarks.bench_e2e " + " ".join(args.argv),
        "cloud": {"address": args.cloud or "started here", "model_id": info.model_id,
                  "calibration": info.cloud_cost.calibration,
                  "prefill_ms": args.cloud_prefill_ms, "step_ms": args.cloud_step_ms},
        "oracle": {"ms_per_token": args.oracle_ms_per_token,
                   "prefill_ms": args.oracle_prefill_ms, "seed": args.seed},
        "speculation": args.speculation, "max_new_tokens": args.max_new_tokens,
        "identical": all(p["identical"] for p in points),
        "points": points, "requests": rows_out, "uplink": uplink,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_e2e",
                                description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.8])
    p.add_argument("--rtt-ms", type=float, nargs="+", default=[1.0, 20.0])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4],
                   help="N: edges (each with its proxy) and concurrent clients")
    p.add_argument("--requests", type=int, default=3, help="per client per point")
    p.add_argument("--cloud-prefill-ms", type=float, default=200.0,
                   help="the started cloud's paced prefill (0 with --cloud-step-ms 0: "
                        "unpaced, calibrated)")
    p.add_argument("--cloud-step-ms", type=float, default=30.0)
    p.add_argument("--cloud-model", default="toy", help="--model of the started cloud")
    p.add_argument("--cloud-random", choices=["full", "tiny"], default=None,
                   help="start the cloud as benchmarks.serve_random with a random target of "
                        "this size (full: 7B-shaped bf16, for the GPU machine) instead of "
                        "--cloud-model; pair it with --edge-model tiny-random")
    p.add_argument("--edge-model", default="toy",
                   help="the edges' --model (its tokenizer must match the cloud's)")
    p.add_argument("--cloud-args", nargs=argparse.REMAINDER, default=[],
                   help="more `eventspec-cloud serve` flags (last on the line), e.g. "
                        "--device cuda --engine static")
    p.add_argument("--cloud", default=None,
                   help="HOST:PORT of a cloud started elsewhere (insecure): none is started")
    p.add_argument("--edge-args", nargs="*", default=[],
                   help="more `eventspec-edge serve` flags, e.g. --device cuda")
    p.add_argument("--oracle-ms-per-token", type=float, default=5.0)
    p.add_argument("--oracle-prefill-ms", type=float, default=20.0)
    p.add_argument("--speculation", choices=["auto", "always"], default="auto")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--uplink-mbit", type=float, nargs="*", default=[],
                   help="also ask one question per feature mode (frames, aligned, auto) "
                        "through an uplink of each rate: TTFT, bytes, the plan's view")
    p.add_argument("--scenes", type=int, default=8, help="toy scenes the edges play")
    p.add_argument("--trials", type=int, default=256, help="reference model trials")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "e2e-cpu-rehearsal.json")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--logs", type=Path, default=None,
                   help="keep the nodes' logs and the answers file here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.argv = argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if max(args.clients) * args.requests < 1 or min(args.clients) < 1:
        print("--clients and --requests must be >= 1", file=sys.stderr)
        return 2
    result = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not args.no_plot:
        result["plot"] = plot(result, args.out.with_suffix(".png"))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"wrote {args.out}")
    if not result["identical"]:
        print("speculative and target-only answers differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
