"""Issue 38, red-team finding 1: what refused multi-megabyte calls leave in a node's memory.

Starts a real node (``eventspec-cloud serve --model toy``, or an edge in front of one) on
loopback with TLS and a token file, the way a user does, then fires ``--calls`` refused
calls carrying a ``--payload-bytes`` request (4 MiB) from this process, ``--concurrency``
at a time, and samples the node's resident memory (``/proc/PID/status`` VmRSS) every
50 ms: before, at the peak, right after, and after ``--idle-s`` seconds with nothing to
do. The kinds of attack (``--kinds``):

- ``health``: ``grpc.health.v1.Health/Check`` without a token (health is open), a body
  that is not a HealthCheckRequest: refused with INVALID_ARGUMENT (or, over the node's
  receive cap, RESOURCE_EXHAUSTED from gRPC).
- ``generate-unauth``: ``Verifier/Generate`` (the edge: ``EdgeAgent/Ask``) without a
  token: refused with UNAUTHENTICATED at HEADERS.
- ``generate-auth``: an authenticated Generate whose Open carries one frame of the
  cloud's frame cap + 1 byte (4 MiB + 1): refused with INVALID_ARGUMENT (cloud only).

Each kind gets a fresh node, so one kind's leftovers do not count against the next.

    python -m benchmarks.bench_refused_memory --out benchmarks/results/refused-memory-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import trustme
from grpc import aio

from benchmarks.stamp import write_result
from eventspec.shared.client.launch import start_node, stop_node, wait_for_port
from eventspec.shared.contract.types import ServerLimits
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.wire.channel import call_metadata, open_channel
from eventspec.shared.wire.health import wait_for_serving
from eventspec.shared.wire.options import channel_options
from eventspec.shared.wire.security import ClientSecurity

TOKEN = "bench-0123456789abcdef0123456789abcdef"
HEALTH_METHOD = "/grpc.health.v1.Health/Check"
GENERATE_METHOD = "/eventspec.v1.Verifier/Generate"
ASK_METHOD = "/eventspec.v1.EdgeAgent/Ask"
KINDS = ("health", "generate-unauth", "generate-auth")


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid``, MB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class RssSampler:
    """VmRSS of one process every ``period_s``, in the background."""

    def __init__(self, pid: int, period_s: float = 0.05) -> None:
        self.pid, self.period_s = pid, period_s
        self.peak = rss_mb(pid)
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError, RuntimeError):
                self.peak = max(self.peak, rss_mb(self.pid))
            await asyncio.sleep(self.period_s)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


def make_pki(root: Path) -> tuple[Path, Path, Path]:
    """(ca, cert, key) of a fresh test CA and a localhost server certificate."""
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost", "127.0.0.1",
                         not_after=dt.datetime.now(dt.UTC) + dt.timedelta(days=2))
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    cert, key = root / "server.pem", root / "server.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    return root / "ca.pem", cert, key


@contextlib.asynccontextmanager
async def node(kind: str, tmp: Path) -> AsyncIterator[tuple[int, int, ClientSecurity]]:
    """A TLS + token node of ``kind`` (cloud or edge, the edge with a plaintext cloud
    of its own): (its pid, its port, a client security with the token)."""
    ca, cert, key = make_pki(tmp)
    (tmp / "tokens").write_text(f"bench:{TOKEN}\n")
    secure = ["--tls-cert", str(cert), "--tls-key", str(key), "--token-file",
              str(tmp / "tokens")]
    sec = ClientSecurity(tls=True, ca=ca, server_name="localhost", token=TOKEN)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cloud_args = ["serve", "--model", "toy", "--port", "0"]
        if kind == "cloud":
            cloud_args += secure
        procs.append(start_node("eventspec-cloud", [
            *cloud_args, "--port-file", str(tmp / "cloud.port")], tmp / "cloud.log"))
        port = await wait_for_port(procs[-1], tmp / "cloud.port", tmp / "cloud.log", 300)
        await wait_for_serving(f"127.0.0.1:{port}", 300,
                               security=sec if kind == "cloud" else None)
        if kind == "edge":
            procs.append(start_node("eventspec-edge", [
                "serve", "--cloud", f"127.0.0.1:{port}", "--model", "toy", "--port", "0",
                *secure, "--port-file", str(tmp / "edge.port")], tmp / "edge.log"))
            port = await wait_for_port(procs[-1], tmp / "edge.port", tmp / "edge.log", 300)
            await wait_for_serving(f"127.0.0.1:{port}", 300, security=sec)
        yield procs[-1].pid, port, sec
    finally:
        for proc in reversed(procs):
            stop_node(proc)


def attack_request(node_kind: str, kind: str, payload: int,
                   num_frames: int = 8) -> tuple[str, bytes, bool]:
    """(method, request bytes, with the token) for one attack call (``num_frames``: the
    cloud's clip length, so that only the oversize frame is wrong)."""
    if kind == "health":
        # A length-delimited field 1 (HealthCheckRequest.service, a string) that is
        # not UTF-8: it does not parse.
        return HEALTH_METHOD, b"\x0a" + _varint(payload) + b"\xff" * payload, False
    if node_kind == "edge":
        if kind == "generate-auth":
            raise SystemExit("generate-auth is a cloud attack")
        return ASK_METHOD, b"\x12" + _varint(payload) + b"x" * payload, False
    frame = ServerLimits().max_frame_bytes + 1 if kind == "generate-auth" else payload
    msg = verifier_pb2.EdgeMessage()
    msg.open.request_id = "refused"
    msg.open.question = "Which way is the object moving?"
    msg.open.frames.frames.append(b"\0" * frame)
    if kind == "generate-auth":
        msg.open.frames.frames.extend([b"\0"] * (num_frames - 1))
    return GENERATE_METHOD, msg.SerializeToString(), kind == "generate-auth"


async def clip_frames(address: str, sec: ClientSecurity) -> int:
    """The frames a cloud's Open must carry."""
    async with open_channel(address, sec) as ch:
        info = await verifier_pb2_grpc.VerifierStub(ch).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=30, metadata=call_metadata(sec))
    return int(info.geometry.num_frames)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


async def fire(address: str, sec: ClientSecurity, method: str, raw: bytes, token: bool,
               calls: int, concurrency: int) -> dict[str, dict[str, Any]]:
    """``calls`` calls of ``raw`` to ``method``, ``concurrency`` at a time, on one
    channel (bytes in, bytes out): how many ended with each status, and the first
    message of each."""
    codes: dict[str, int] = {}
    details: dict[str, str] = {}
    metadata = (("authorization", f"Bearer {TOKEN}"),) if token else ()
    left = calls
    client_sec = sec if token else ClientSecurity(tls=True, ca=sec.ca,
                                                  server_name=sec.server_name)
    async with open_channel(address, client_sec, channel_options(64 << 20)) as ch:
        streaming = method == GENERATE_METHOD
        unary = ch.unary_unary(method)
        stream = ch.stream_stream(method)

        async def one() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                code = "OK"
                try:
                    if streaming:
                        async for _ in stream(iter([raw]), timeout=60, metadata=metadata):
                            pass
                    else:
                        await unary(raw, timeout=60, metadata=metadata)
                except aio.AioRpcError as exc:
                    code = exc.code().name
                    details.setdefault(code, (exc.details() or "")[:160])
                codes[code] = codes.get(code, 0) + 1

        await asyncio.gather(*(one() for _ in range(concurrency)))
    return {"outcomes": codes, "details": details}


async def measure(node_kind: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="refused-mem-") as d:
        async with node(node_kind, Path(d)) as (pid, port, sec):
            frames = await clip_frames(f"127.0.0.1:{port}", sec) if node_kind == "cloud" else 0
            method, raw, token = attack_request(node_kind, kind, args.payload_bytes, frames)
            await asyncio.sleep(2.0)  # let start-up settle
            start = rss_mb(pid)
            t0 = time.monotonic()
            with RssSampler(pid) as sampler:
                fired = await fire(f"127.0.0.1:{port}", sec, method, raw, token, args.calls,
                                   args.concurrency)
                took = time.monotonic() - t0
                right_after = rss_mb(pid)
                idle: dict[str, float] = {}
                waited = 0.0
                for mark in (1.0, 2.0, 5.0, args.idle_s):
                    if mark <= waited:
                        continue
                    await asyncio.sleep(mark - waited)
                    waited = mark
                    idle[f"{mark:g}"] = round(rss_mb(pid), 1)
            after = rss_mb(pid)
            result = {
                "node": node_kind, "kind": kind, "method": method, "calls": args.calls,
                "concurrency": args.concurrency, "request_bytes": len(raw),
                "authenticated": token, **fired, "attack_s": round(took, 2),
                "rss_start_mb": round(start, 1), "rss_peak_mb": round(sampler.peak, 1),
                "rss_right_after_mb": round(right_after, 1),
                "rss_after_idle_mb": round(after, 1), "idle_s": args.idle_s,
                "rss_during_idle_mb": idle,
                "growth_peak_mb": round(sampler.peak - start, 1),
                "growth_after_idle_mb": round(after - start, 1),
            }
            print(json.dumps(result), flush=True)
            return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "what": "node RSS before, at the peak of and after refused multi-megabyte calls "
                "(issue 38, red-team finding 1)",
        "payload_bytes": args.payload_bytes, "calls": args.calls,
        "concurrency": args.concurrency, "idle_s": args.idle_s, "cpus": os.cpu_count(),
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
        "load_avg_1m_at_start": os.getloadavg()[0], "runs": []}
    for node_kind in args.nodes.split(","):
        for kind in args.kinds.split(","):
            if node_kind == "edge" and kind == "generate-auth":
                continue
            out["runs"].append(await measure(node_kind, kind, args))
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="cloud,edge", help="cloud, edge or both")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"some of {', '.join(KINDS)}")
    p.add_argument("--calls", type=int, default=600)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--payload-bytes", type=int, default=4 << 20)
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = await run(args)
    if args.out is not None:
        write_result(args.out, result, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
