"""``make gpu-gate``: what users start, started for real on a GPU, before a change to the
engine, warm-up, calibration, scheduler or edge drafter lands.

Why: 133 GPU tests passed while the full-size cloud did not start at its defaults
(issue 35: calibration prefilled an unreserved KV-by-length run). Kernel tests do not
start the server the way a user does; this does. Each phase starts real processes over
the full-size (7B-shaped) random models, as ``benchmarks/serve_random.py`` serves them
through ``eventspec-cloud serve`` / ``eventspec-edge serve``'s own parsers and servers:

- ``cloud``: the cloud at its defaults (KV by length, calibration, CUDA graphs), to
  SERVING, then GetServerInfo and ``eventspec status``; then ``--kv-layout slots`` the
  same way; with ``--load``, on the by-length cloud, more concurrent 2.2k-token requests
  than it runs at once (its sessions plus ``--extra``): how many ran at once, how many
  waited, how many were refused (the goal: 40+ at once on an 80 GB card, none refused);
- ``edge``: a ``--batch-invariant`` cloud (otherwise at defaults, but for a KV budget
  that leaves the card room for an edge beside it, and ``--verify-width all`` so drafts
  are verified even where the cost model would skip them: random weights make α ≈ 0)
  and one edge process per drafter weight format (bf16, int8, int4; ONNX vision only
  where onnxruntime-gpu is installed; ``--speculation always``) through the delay proxy
  (1 ms each way), one Ask in each feature mode, target-only and speculative: the
  speculative answer must be the target-only answer token for token, with drafts
  verified.

Each phase writes ``gpu-gate-<phase>-<device>.json`` (stamped: commit, device, versions,
command) under ``--out-dir`` and the processes' logs beside it; the exit status is
non-zero when any check failed.

    PYTHONPATH=.eventspec-tree:. python3 -m benchmarks.gpu_gate --phase cloud --load
    PYTHONPATH=.eventspec-tree:. python3 -m benchmarks.gpu_gate --phase edge
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from benchmarks.stamp import scrub_paths, stamp
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.client.launch import stop_node, wait_for_port
from eventspec.shared.contract.types import AskSpec, FeatureMode, GenerationSettings, Mode
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.wire.health import wait_for_serving
from tests.support.delay_proxy import DelayProxy

QUESTION = "What is moving?"
#: A node's start, warm-up included (the full-size cloud captures graphs and calibrates).
START_S = 420.0
#: Answer tokens of the load phase's requests: with the 2,083-token prompt, 2.2k positions.
LOAD_TOKENS = 128
#: Answer tokens of the edge phase's Asks: enough to outlast an int4 prefill (about 330 ms
#: on an H100), so every drafter has time to draft.
ASK_TOKENS = 96
#: The edge phase's cloud KV budget: room for 20 sessions, and for the edge on one card.
EDGE_PHASE_KV_GB = 24.0
#: Lines of a node's log the summary keeps (what it said about capacity and warm-up).
KEPT_LOG = re.compile(r"KV capacity|sessions:|static engine|calibrat|ERROR|Traceback|"
                      r"warm on|SERVING|drafter")


@dataclass
class Gate:
    """The run's checks and records, written as one JSON."""

    phase: str
    out_dir: Path
    checks: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, ok: bool, detail: str) -> bool:
        detail = " ".join(detail.split())  # one line: a status line's padding, a traceback
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
        return ok

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c["ok"] for c in self.checks)

    def write(self) -> Path:
        st = stamp()
        slug = re.sub(r"[^a-z0-9]+", "-", st["device"].lower().replace("nvidia", "")).strip("-")
        path = self.out_dir / f"gpu-gate-{self.phase}-{slug or 'cpu'}.json"
        body = {"stamp": st, "phase": self.phase, "passed": self.passed,
                "checks": self.checks, **self.records}
        path.write_text(scrub_paths(json.dumps(body, indent=2)) + "\n")
        print(f"wrote {path}: {'PASSED' if self.passed else 'FAILED'}", flush=True)
        return path


@dataclass
class Node:
    """One started process: its address, log and start time."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    address: str
    start_s: float

    def log_lines(self) -> list[str]:
        """The lines of its log worth keeping in the summary (machine paths scrubbed)."""
        text = self.log.read_text(errors="replace")
        return [scrub_paths(line[:400]) for line in text.splitlines() if KEPT_LOG.search(line)]


@dataclass(frozen=True)
class Options:
    """What the phases run on, and the thresholds they check."""

    device: str = "cuda"
    size: str = "full"  # serve_random's --size: "tiny" rehearses the gate on a CPU
    load_tokens: int = LOAD_TOKENS
    extra: int = 16
    min_running: int = 40
    edge_cloud_kv_gb: float = EDGE_PHASE_KV_GB
    quants: tuple[str, ...] = ("none", "int8", "int4")
    #: One-way delay of the proxy between edge and cloud. Small by default: with random
    #: weights every draft is wrong, so a tail that took a long round trip is stale when
    #: it lands (one chain per session, issue 36) and nothing would be verified.
    proxy_delay_ms: float = 1.0
    #: Check that each speculative Ask verified drafts, a check of its own beside the
    #: answer's (off for a CPU rehearsal, whose drafter is slow beside its cloud's steps).
    require_drafts: bool = True


async def start(name: str, node: str, serve_args: Sequence[str], out_dir: Path,
                opts: Options, ours: Sequence[str] = ()) -> Node:
    """``benchmarks.serve_random --node NODE`` with ``serve_args``, to SERVING."""
    log_path, port_file = out_dir / f"{name}.log", out_dir / f"{name}.port"
    port_file.unlink(missing_ok=True)
    t0 = time.monotonic()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.serve_random", "--node", node, "--size",
             opts.size, "--device", opts.device, *ours, "--", "--port", "0", "--port-file",
             str(port_file), *serve_args],
            stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        port = await wait_for_port(proc, port_file, log_path, START_S)
        address = f"127.0.0.1:{port}"
        await wait_for_serving(address, timeout_s=START_S)
    except BaseException:
        stop_node(proc)
        raise
    return Node(name, proc, log_path, address, time.monotonic() - t0)


async def server_info(address: str) -> verifier_pb2.ServerInfo:
    async with aio.insecure_channel(address) as ch:
        return await verifier_pb2_grpc.VerifierStub(ch).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=30)


def status_text(address: str) -> tuple[int, str]:
    """``eventspec status ADDRESS`` as a user runs it: (exit status, what it printed)."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from eventspec.shared.client.cli import main; "
                               "sys.exit(main(sys.argv[1:]))", "status", address],
        capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


async def cloud_at_defaults(gate: Gate, layout: str, opts: Options) -> Node:
    """Start the cloud (``--kv-layout layout``, everything else at defaults); check it
    serves, answers GetServerInfo and ``eventspec status``."""
    args = [] if layout == "by-length" else ["--kv-layout", layout]
    name = f"cloud-{layout}"
    try:
        node = await start(name, "cloud", args, gate.out_dir, opts)
    except (RuntimeError, TimeoutError) as exc:
        gate.check(f"{name}: reaches SERVING at defaults", False, str(exc)[-1500:])
        raise
    info = await server_info(node.address)
    rc, text = status_text(node.address)
    capacity = next((line.strip() for line in text.splitlines() if "capacity" in line), "")
    gate.records[name] = {
        "start_s": round(node.start_s, 1), "kv_slots": info.limits.kv_slots,
        "kv_tokens_per_slot": info.limits.kv_tokens_per_slot,
        "max_sessions": info.limits.max_sessions, "calibration": info.profile.calibration,
        "step_base_ms": round(info.profile.step_base_ms, 3), "status": text.splitlines(),
        "log": node.log_lines(),
    }
    gate.check(f"{name}: reaches SERVING at defaults", True,
               f"in {node.start_s:.0f} s; {info.limits.kv_slots} sessions of up to "
               f"{info.limits.kv_tokens_per_slot} positions, {info.limits.max_sessions} admitted")
    gate.check(f"{name}: eventspec status", rc == 0 and "serving" in text and bool(capacity),
               capacity or text[-300:])
    return node


def load_message(seed: int, tokens: int) -> verifier_pb2.EdgeMessage:
    """The Open of one target-only 2.2k-token load request (eight 224-pixel PNG frames)."""
    from tests.support import cloud_harness as h

    return h.open_msg(QUESTION, h.make_frames(seed, size=224), max_new_tokens=tokens,
                      speculative=False)


async def one_request(address: str, msg: verifier_pb2.EdgeMessage) -> str:
    """One request through Generate: "ok" or its status code."""
    from tests.support import cloud_harness as h

    port = int(address.rsplit(":", 1)[1])
    try:
        await h.run_generate(port, msg, timeout=300)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return "ok"


async def hold_many(gate: Gate, node: Node, opts: Options) -> None:
    """More concurrent requests than the cloud runs: the most that ran at once, the most
    that waited, and how many were refused."""
    info = await server_info(node.address)
    running = info.limits.kv_slots
    n = running + opts.extra
    peak = {"running": 0, "waiting": 0}
    stats_ms: list[float] = []  # how long each GetStats took under this load
    stats_timeouts_at: list[float] = []  # when each GetStats that ran out was sent (s)
    done = asyncio.Event()

    async def watch() -> None:
        async with aio.insecure_channel(node.address) as ch:
            stub = verifier_pb2_grpc.VerifierStub(ch)
            while not done.is_set():
                t = time.monotonic()
                try:
                    s = await stub.GetStats(verifier_pb2.GetStatsRequest(), timeout=10)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise
                    stats_timeouts_at.append(round(t - t0, 1))
                    continue
                stats_ms.append((time.monotonic() - t) * 1e3)
                peak["running"] = max(peak["running"], s.kv_slots_used)
                peak["waiting"] = max(peak["waiting"], s.live_sessions - s.kv_slots_used)
                await asyncio.sleep(0.01)

    # Built before the clock and the watcher start, off this event loop: encoding the
    # frames takes seconds (``messages_built_s``), and built inside each request it held
    # up the watcher's GetStats replies and the wall, which were then read as the server's.
    t_build = time.monotonic()
    messages = await asyncio.to_thread(
        lambda: [load_message(i, opts.load_tokens) for i in range(n)])
    built_s = time.monotonic() - t_build
    t0 = time.monotonic()
    watcher = asyncio.create_task(watch())
    outcomes = await asyncio.gather(*(one_request(node.address, msg) for msg in messages))
    wall = time.monotonic() - t0
    done.set()
    await watcher
    counts = {o: outcomes.count(o) for o in sorted(set(outcomes))}
    gate.records["load"] = {"requests": n, "answer_tokens": opts.load_tokens, "outcomes": counts,
                            "peak_running": peak["running"], "peak_waiting": peak["waiting"],
                            "wall_s": round(wall, 2), "messages_built_s": round(built_s, 2),
                            "get_stats_calls": len(stats_ms),
                            "get_stats_timeouts_10s": len(stats_timeouts_at),
                            "get_stats_timeouts_sent_at_s": stats_timeouts_at,
                            "get_stats_ms_median": round(statistics.median(stats_ms), 1)
                            if stats_ms else None,
                            "get_stats_ms_max": round(max(stats_ms), 1) if stats_ms else None}
    gate.check(f"load: {opts.min_running}+ concurrent sessions of {opts.load_tokens}-token "
               "answers", peak["running"] >= opts.min_running,
               f"{peak['running']} ran at once (the cloud runs up to {running})")
    gate.check("load: the rest queued, none refused", counts == {"ok": n}
               and peak["waiting"] > 0,
               f"{n} requests: {counts}; at most {peak['waiting']} waited for KV")


async def cloud_phase(gate: Gate, opts: Options, load: bool) -> None:
    for layout in ("by-length", "slots"):
        node = await cloud_at_defaults(gate, layout, opts)
        try:
            if load and layout == "by-length":
                await hold_many(gate, node, opts)
        finally:
            stop_node(node.proc)


def onnx_gpu_present() -> bool:
    try:
        import onnxruntime
    except ImportError:
        return False
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


async def ask_both_modes(edge: str, feature: FeatureMode) -> dict[str, Any]:
    """Target-only then speculative, the same clip and question: tokens and statistics."""
    out: dict[str, Any] = {}
    async with EdgeClient(edge, timeout_s=300) as client:
        for mode in (Mode.TARGET_ONLY, Mode.SPECULATIVE):
            final = await client.ask_final(AskSpec(
                QUESTION, mode=mode, feature_mode=feature,
                generation=GenerationSettings(max_new_tokens=ASK_TOKENS)))
            out[mode.name.lower()] = {
                "tokens": list(final.token_ids), "finish": final.finish_reason.name,
                "drafted": final.stats.drafted, "accepted": final.stats.accepted,
                "hidden_drafted": final.stats.hidden_drafted,
                "ttft_ms": round(final.stats.ttft_ms, 1),
                "draft_prefill_ms": round(final.stats.stage_ms.get("draft_prefill", 0.0), 1),
                "feature_mode": final.feature_mode.name if final.feature_mode else None}
    return out


def drafts_verified(spec: dict[str, Any]) -> tuple[bool, str]:
    """Whether the speculative answer verified drafts, where it could have.

    Random weights: only hidden drafts survive (a later draft follows a commit the random
    target never agrees with, and reaches the cloud after its next step has started), and
    a hidden draft exists only when the draft prefill ends before the first token. An
    int4 drafter's prefill (338 ms for 737 tokens on an H200) outlasts the cloud's time to
    first token (about 200 ms), so there the check has nothing to see and says so."""
    seen = f"{spec['drafted']} drafted ({spec['hidden_drafted']} hidden)"
    prefill, ttft = spec.get("draft_prefill_ms", 0.0), spec["ttft_ms"]
    if spec["drafted"] + spec["hidden_drafted"] == 0 and 0 < ttft <= prefill:
        return True, (f"not applicable: the draft prefill ({prefill:g} ms) ends after the "
                      f"first token ({ttft:g} ms), so a random drafter has no hidden draft "
                      f"to verify; {seen}")
    return spec["drafted"] + spec["hidden_drafted"] > 0, seen


async def edge_phase(gate: Gate, opts: Options) -> None:
    cloud = await start("cloud-invariant", "cloud",
                        ["--batch-invariant", "--verify-width", "all",
                         "--kv-cache-gb", f"{opts.edge_cloud_kv_gb:g}"],
                        gate.out_dir, opts)
    g = (await server_info(cloud.address)).geometry
    geometry = f"{g.num_frames},{g.tokens_per_frame},{g.feature_dim}"
    gate.records["cloud-invariant"] = {"start_s": round(cloud.start_s, 1),
                                       "log": cloud.log_lines()}
    host, port = cloud.address.rsplit(":", 1)
    proxy = await DelayProxy((host, int(port)), delay_ms=opts.proxy_delay_ms).start()
    vision = ["torch", *(["onnx"] if onnx_gpu_present() else [])]
    gate.records["vision_backends"] = vision
    if "onnx" not in vision:
        gate.records["onnx_skipped"] = "onnxruntime-gpu is not installed on this machine"
    try:
        for quant in opts.quants:
            name = f"edge-{quant}"
            dtype = ["--dtype", "bfloat16"] if opts.size == "full" else []
            try:
                edge = await start(name, "edge", [
                    "--cloud", f"127.0.0.1:{proxy.port}", "--device", opts.device, *dtype,
                    "--source", "toy:7", "--draft-quant", quant, "--speculation", "always"],
                    gate.out_dir, opts, ours=["--video-geometry", geometry])
            except (RuntimeError, TimeoutError) as exc:
                gate.check(f"{name}: reaches SERVING", False, str(exc)[-1500:])
                continue
            try:
                record: dict[str, Any] = {"start_s": round(edge.start_s, 1)}
                for feature in (FeatureMode.FRAMES, FeatureMode.ALIGNED):
                    answers = await ask_both_modes(edge.address, feature)
                    record[feature.name.lower()] = answers
                    same = answers["target_only"]["tokens"] == answers["speculative"]["tokens"]
                    spec = answers["speculative"]
                    gate.check(f"{name} {feature.name.lower()}: speculative == target-only",
                               same and bool(answers["target_only"]["tokens"]),
                               f"{len(spec['tokens'])} tokens, {spec['drafted']} drafted "
                               f"({spec['hidden_drafted']} hidden), {spec['accepted']} "
                               "accepted")
                    if opts.require_drafts:
                        gate.check(f"{name} {feature.name.lower()}: drafts verified",
                                   *drafts_verified(spec))
                record["log"] = edge.log_lines()
                gate.records[name] = record
            finally:
                stop_node(edge.proc)
    finally:
        await proxy.stop()
        stop_node(cloud.proc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--phase", choices=["cloud", "edge"], required=True)
    parser.add_argument("--load", action="store_true",
                        help="cloud phase: the concurrent-sessions check")
    parser.add_argument("--extra", type=int, default=16,
                        help="load: requests beyond what the cloud runs at once")
    parser.add_argument("--quants", default="none,int8,int4",
                        help="edge phase: --draft-quant values, one edge process each")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", choices=["full", "tiny"], default="full",
                        help="the random models' size (tiny: a rehearsal on a CPU)")
    parser.add_argument("--load-tokens", type=int, default=LOAD_TOKENS)
    parser.add_argument("--min-running", type=int, default=40,
                        help="load: the sessions that must run at once")
    parser.add_argument("--proxy-delay-ms", type=float, default=1.0,
                        help="edge phase: the proxy's one-way delay")
    parser.add_argument("--no-require-drafts", dest="require_drafts", action="store_false",
                        help="edge phase: pass without drafts verified (a CPU rehearsal)")
    parser.add_argument("--edge-cloud-kv-gb", type=float, default=EDGE_PHASE_KV_GB,
                        help="edge phase: the cloud's KV budget (room for the edge)")
    parser.add_argument("--out-dir", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    gate = Gate(args.phase, args.out_dir)
    opts = Options(device=args.device, size=args.size, load_tokens=args.load_tokens,
                   extra=args.extra, min_running=args.min_running,
                   edge_cloud_kv_gb=args.edge_cloud_kv_gb, quants=tuple(args.quants.split(",")),
                   proxy_delay_ms=args.proxy_delay_ms, require_drafts=args.require_drafts)
    try:
        if args.phase == "cloud":
            asyncio.run(cloud_phase(gate, opts, args.load))
        else:
            asyncio.run(edge_phase(gate, opts))
    except (RuntimeError, TimeoutError, grpc.RpcError) as exc:
        gate.check("the phase ran to its end", False, f"{type(exc).__name__}: {exc}"[-2000:])
    gate.write()
    return 0 if gate.passed else 1


if __name__ == "__main__":
    sys.exit(main())
