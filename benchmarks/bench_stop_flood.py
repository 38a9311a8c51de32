"""Issue 38, red-team finding 2: other clients' latency while a process on the same machine
floods refused stop-string requests, through the edge (``Ask``) and against the cloud
(``Generate``).

Each path is measured twice with the same legitimate clients asking in a loop: alone,
then while an attacker process keeps ``--attackers`` requests in flight whose generation
settings carry ``--stop-strings`` one-character stop strings (3 MB at 10^6; refused with
INVALID_ARGUMENT: at most 16 are allowed). The attacker sends its request as bytes
serialized once, as a real attacker would, so its own CPU goes into sending, not into
building messages. Everything shares this machine's cores, the attacker's CPU included.

    python -m benchmarks.bench_stop_flood --out benchmarks/results/stop-flood-cpu.json

The cloud is paced (50 ms prefill, 10 ms per step, as ``bench_hardening``) so a request
takes a while, as on a GPU server, and the toy models' CPU time does not dominate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from grpc import aio

from benchmarks.bench_hardening import PACE, nodes
from benchmarks.stamp import write_result
from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract import convert_ask, convert_verifier
from eventspec.shared.contract.types import AskSpec, GenerationSettings, Mode, OpenRequest
from eventspec.shared.node.imageproc import encode_png
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.wire.options import channel_options

QUESTION = "Which way is the object moving?"
ASK = AskSpec(question=QUESTION, mode=Mode.SPECULATIVE,
              generation=GenerationSettings(max_new_tokens=16))
ASK_METHOD = "/eventspec.v1.EdgeAgent/Ask"
GENERATE_METHOD = "/eventspec.v1.Verifier/Generate"
#: One legitimate request: returns once its answer is complete.
Request = Callable[[], Awaitable[None]]


def frames(num_frames: int) -> tuple[bytes, ...]:
    """Small random PNG frames: the cloud resizes them, and their size is not the point."""
    rng = np.random.default_rng(0)
    return tuple(encode_png(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
                 for _ in range(num_frames))


def stops(count: int) -> tuple[str, ...]:
    return tuple("abcdefgh"[i % 8] for i in range(count))


def open_message(num_frames: int, stop: tuple[str, ...] = ()) -> verifier_pb2.EdgeMessage:
    """A target-only Open with frames: what a cloud client sends first."""
    req = OpenRequest(request_id="flood", question=QUESTION,
                      generation=GenerationSettings(max_new_tokens=16, stop=stop),
                      frames=frames(num_frames), speculative=False)
    return verifier_pb2.EdgeMessage(open=convert_verifier.open_to_pb(req))


async def num_frames(address: str) -> int:
    async with aio.insecure_channel(address) as ch:
        info = await verifier_pb2_grpc.VerifierStub(ch).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=30)
    return int(info.geometry.num_frames)


# -- the attacker (a process of its own) -------------------------------------------------


def attack_bytes(target: str, kind: str, count: int, n_frames: int) -> tuple[str, bytes]:
    """The method and the serialized request the attacker sends again and again: ``count``
    stop strings, or (``kind`` bulk, the control) as many bytes without them: a question
    through the edge, frames that are not images against the cloud."""
    size = 3 * count
    if target == "edge":
        question, stop = (QUESTION, stops(count)) if kind == "stops" else ("x" * size, ())
        spec = AskSpec(question=question, mode=Mode.SPECULATIVE,
                       generation=GenerationSettings(max_new_tokens=16, stop=stop))
        return ASK_METHOD, convert_ask.ask_spec_to_pb(spec).SerializeToString()
    if kind == "stops":
        return GENERATE_METHOD, open_message(n_frames, stops(count)).SerializeToString()
    msg = open_message(n_frames)
    del msg.open.frames.frames[:]
    msg.open.frames.frames.extend([b"\0" * (size // n_frames)] * n_frames)
    return GENERATE_METHOD, msg.SerializeToString()


async def attack(target: str, kind: str, address: str, seconds: float, concurrency: int,
                 count: int, n_frames: int) -> dict[str, Any]:
    """Keep ``concurrency`` refused requests in flight for ``seconds``."""
    method, raw = attack_bytes(target, kind, count, n_frames)
    codes: dict[str, int] = {}
    took: list[float] = []
    end = time.monotonic() + seconds
    async with aio.insecure_channel(address, options=channel_options()) as ch:
        call = ch.stream_stream(method)  # bytes in, bytes out: no serialization here

        async def one() -> None:
            while time.monotonic() < end:
                t0 = time.monotonic()
                code = "OK"
                try:
                    async for _ in call(iter([raw]), timeout=60):
                        pass
                except aio.AioRpcError as exc:
                    code = exc.code().name
                took.append(time.monotonic() - t0)
                codes[code] = codes.get(code, 0) + 1

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return {"requests": len(took), "bytes_each": len(raw), "outcomes": codes,
            "refused_median_ms": round(statistics.median(took) * 1e3, 1) if took else None}


# -- the legitimate clients ----------------------------------------------------------------


async def loop_requests(request: Request, clients: int, seconds: float,
                        failures: list[str] | None = None) -> list[float]:
    """``clients`` callers asking in a loop for ``seconds``: each answer's latency (a
    failed request goes to ``failures`` instead)."""
    took: list[float] = []
    end = time.monotonic() + seconds

    async def client() -> None:
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                await request()
            except (RuntimeError, aio.AioRpcError) as exc:
                if failures is None:
                    raise
                failures.append(str(exc)[:200])
                continue
            took.append(time.monotonic() - t0)

    await asyncio.gather(*(client() for _ in range(clients)))
    return took


def edge_request(client: EdgeClient) -> Request:
    async def ask() -> None:
        try:
            await client.ask_final(ASK)
        except AskError as exc:
            raise RuntimeError(f"a legitimate Ask failed: {exc}") from exc
    return ask


def cloud_request(channel: aio.Channel, n_frames: int) -> Request:
    stub = verifier_pb2_grpc.VerifierStub(channel)
    first = open_message(n_frames)

    async def generate() -> None:
        async for msg in stub.Generate(iter([first]), timeout=60):
            if msg.WhichOneof("kind") == "done":
                return
        raise RuntimeError("a legitimate Generate ended without Done")
    return generate


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used so far (Linux), its threads included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds per named process over one phase: who used the machine's cores."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = dict(pids)
        self.start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def add(self, name: str, pid: int) -> None:
        self.pids[name], self.start[name] = pid, cpu_seconds(pid)

    def used(self) -> dict[str, float]:
        return {name: round(cpu_seconds(pid) - self.start[name], 2)
                for name, pid in self.pids.items()}


async def measure(request: Request, target: str, address: str, args: argparse.Namespace,
                  n_frames: int, pids: dict[str, int]) -> dict[str, Any]:
    """Latency alone, then beside the attacker process, with the CPU each process used."""
    pids = {**pids, "clients": os.getpid()}
    await loop_requests(request, args.clients, 2.0)  # warm the path
    failed_alone: list[str] = []
    failed_beside: list[str] = []
    meter = CpuMeter(pids)
    alone = await loop_requests(request, args.clients, args.seconds, failed_alone)
    cpu_alone = meter.used()
    attacker = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.bench_stop_flood", "--attack", target,
        "--address", address, "--seconds", str(args.seconds + 3),
        "--attackers", str(args.attackers), "--stop-strings", str(args.stop_strings),
        "--attack-kind", args.attack_kind,
        "--num-frames", str(n_frames), stdout=asyncio.subprocess.PIPE,
        cwd=str(Path(__file__).resolve().parent.parent))
    await asyncio.sleep(3.0)  # the attacker builds its message and starts flooding
    meter = CpuMeter(pids)
    meter.add("attacker", attacker.pid)
    beside = await loop_requests(request, args.clients, args.seconds, failed_beside)
    cpu_beside = meter.used()
    out, _ = await attacker.communicate()
    p50_alone, p50_beside = statistics.median(alone), statistics.median(beside)
    return {"requests_alone": len(alone), "requests_beside": len(beside),
            "p50_alone_ms": round(p50_alone * 1e3, 1),
            "p50_beside_attacker_ms": round(p50_beside * 1e3, 1),
            "ratio": round(p50_beside / p50_alone, 3),
            "failed_alone": failed_alone, "failed_beside": failed_beside,
            "cpu_s_alone": cpu_alone, "cpu_s_beside": cpu_beside,
            "attacker": json.loads(out)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"clients": args.clients, "seconds": args.seconds,
                           "attackers": args.attackers, "stop_strings": args.stop_strings,
                           "attack_kind": args.attack_kind,
                           "cloud_pace": PACE, "cpus": os.cpu_count(),
                           "load_avg_1m_at_start": os.getloadavg()[0]}
    async with nodes() as n:
        cport = await n.cloud("c")
        cloud = f"127.0.0.1:{cport}"
        pids = {"cloud": n.proc(0).pid}
        n_frames = await num_frames(cloud)
        if "edge" in args.paths:
            edge = f"127.0.0.1:{await n.edge(cloud)}"
            pids["edge"] = n.proc(1).pid
            async with EdgeClient(edge, timeout_s=60) as client:
                out["edge"] = await measure(edge_request(client), "edge", edge, args, n_frames,
                                            pids)
            print(json.dumps({"edge": out["edge"]}), flush=True)
        if "cloud" in args.paths:
            async with aio.insecure_channel(cloud, options=channel_options()) as ch:
                out["cloud"] = await measure(cloud_request(ch, n_frames), "cloud", cloud, args,
                                             n_frames, pids)
            print(json.dumps({"cloud": out["cloud"]}), flush=True)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--paths", default="edge,cloud", help="edge, cloud or both (comma-separated)")
    p.add_argument("--clients", type=int, default=4, help="legitimate clients")
    p.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    p.add_argument("--attackers", type=int, default=16, help="attack requests in flight")
    p.add_argument("--stop-strings", type=int, default=1_000_000)
    p.add_argument("--attack-kind", choices=("stops", "bulk"), default="stops",
                   help="stops: the stop-string flood; bulk: the control, as many bytes "
                        "without stop strings (a long question, frames that are not images)")
    p.add_argument("--out", type=Path, default=None)
    # The attacker process's own arguments.
    p.add_argument("--attack", choices=("edge", "cloud"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--address", default="", help=argparse.SUPPRESS)
    p.add_argument("--num-frames", type=int, default=8, help=argparse.SUPPRESS)
    return p.parse_args(argv)


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.attack is not None:
        result = await attack(args.attack, args.attack_kind, args.address, args.seconds,
                              args.attackers, args.stop_strings, args.num_frames)
        print(json.dumps(result), flush=True)
        return 0
    args.paths = set(args.paths.split(","))
    result = await run(args)
    if args.out is not None:
        write_result(args.out, result, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
