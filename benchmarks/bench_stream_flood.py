"""Issue 38, red-team finding 5: authenticated Generate and main-port health while another
process floods the cloud with HTTP/2 streams.

A cloud that requires a bearer token (``--token-file``, plaintext on loopback) is measured
three times with the same legitimate load: ``--clients`` authenticated clients calling
Generate in a loop, and a health Check on a fresh connection every ``PROBE_EVERY_S``
(what a Kubernetes probe does):

- ``alone``;
- ``refused``: an attacker process (raw HTTP/2, the ``h2`` library) keeps
  ``ATTACK_CONNECTIONS`` connections each with ``ATTACK_STREAMS`` Generate streams open
  without a token, opening a new stream as soon as the server ends one (each is refused
  UNAUTHENTICATED at HEADERS) and a new connection as soon as the server closes one: a
  flood of unauthenticated stream openings;
- ``stalled``: the attacker keeps the same number of streams stalled, HEADERS and part of
  a request message never finished, over Generate, GetServerInfo and health, opening a
  new one whenever the server times one out (the slowloris of issue 19).

Everything shares this machine's cores, the attacker's CPU included.

    python -m benchmarks.bench_stream_flood --out benchmarks/results/stream-flood-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.bench_hardening import nodes
from benchmarks.bench_stop_flood import CpuMeter, loop_requests, open_message
from benchmarks.stamp import write_result
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.wire.options import channel_options

GENERATE = "/eventspec.v1.Verifier/Generate"
STALL_METHODS = (GENERATE, "/eventspec.v1.Verifier/GetServerInfo",
                 "/grpc.health.v1.Health/Check")
#: The attacker's connections and the streams it keeps open on each (1,000 in all, as
#: the red team's).
ATTACK_CONNECTIONS = 10
ATTACK_STREAMS = 100
#: Seconds between health probes.
PROBE_EVERY_S = 0.25
#: A gRPC frame header that declares a 100-byte message, and 10 of its bytes.
PARTIAL_MESSAGE = b"\x00\x00\x00\x00\x64" + b"\x0a" * 10


# -- the attacker (a process of its own) -------------------------------------------------


async def _connection(host: str, port: int, kind: str, streams: int, end: float,
                      ended: Counter[str]) -> int:
    """One connection keeping ``streams`` streams open until ``end``; returns how many it
    opened. ``refused``: HEADERS only, reopened whenever one ends; ``stalled``: HEADERS and
    part of a message, reopened when the server times one out."""
    reader, writer = await asyncio.open_connection(host, port)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    opened = 0

    def open_stream() -> None:
        nonlocal opened
        sid = conn.get_next_available_stream_id()
        method = GENERATE if kind == "refused" else STALL_METHODS[opened % len(STALL_METHODS)]
        try:
            conn.send_headers(sid, [
                (":method", "POST"), (":scheme", "http"), (":path", method),
                (":authority", f"{host}:{port}"), ("content-type", "application/grpc"),
                ("te", "trailers")])
            if kind == "stalled":
                conn.send_data(sid, PARTIAL_MESSAGE)
        except h2.exceptions.TooManyStreamsError:
            ended["too many streams (client side)"] += 1
            return
        opened += 1

    for _ in range(streams):
        open_stream()
    writer.write(conn.data_to_send())
    try:
        while time.monotonic() < end:
            try:
                data = await asyncio.wait_for(reader.read(65536), end - time.monotonic())
            except TimeoutError:
                break
            if not data:
                ended["connection closed"] += 1
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    status = dict(event.headers).get(b"grpc-status")
                    if status is None:
                        continue
                    ended[f"grpc-status {status.decode()}"] += 1
                    if kind == "refused" or status == b"4":
                        open_stream()
                elif isinstance(event, h2.events.StreamReset):
                    ended[f"reset {event.error_code!s}"] += 1
                    if kind == "refused":
                        open_stream()
                elif isinstance(event, h2.events.ConnectionTerminated):
                    ended[f"GOAWAY {event.error_code!s}"] += 1
            writer.write(conn.data_to_send())
            await writer.drain()
    except (ConnectionError, h2.exceptions.ProtocolError) as exc:
        ended[f"error {type(exc).__name__}"] += 1
    finally:
        writer.close()
    return opened


async def _reconnecting(host: str, port: int, kind: str, end: float,
                        ended: Counter[str]) -> tuple[int, int]:
    """``_connection`` again whenever the server closes it, until ``end``: (streams
    opened, connections made)."""
    opened = connections = 0
    while time.monotonic() < end:
        connections += 1
        try:
            opened += await _connection(host, port, kind, ATTACK_STREAMS, end, ended)
        except OSError as exc:
            ended[f"connect error {type(exc).__name__}"] += 1
            await asyncio.sleep(0.01)
    return opened, connections


async def attack(address: str, kind: str, seconds: float) -> dict[str, Any]:
    """``ATTACK_CONNECTIONS`` connections of ``kind`` for ``seconds``, each opened again
    whenever the server closes it."""
    host, port = address.rsplit(":", 1)
    end = time.monotonic() + seconds
    ended: Counter[str] = Counter()
    got = await asyncio.gather(*(_reconnecting(host, int(port), kind, end, ended)
                                 for _ in range(ATTACK_CONNECTIONS)))
    opened = sum(o for o, _ in got)
    return {"kind": kind, "connections": ATTACK_CONNECTIONS, "streams_each": ATTACK_STREAMS,
            "opened": opened, "opened_per_s": round(opened / seconds),
            "connections_made": sum(c for _, c in got), "ended": dict(ended)}


# -- the legitimate clients ----------------------------------------------------------------


#: Probes slower than this are listed with when they started in their phase.
SLOW_PROBE_S = 0.05


async def probe_health(address: str, end: float,
                       slow: list[tuple[float, float]] | None = None) -> list[float]:
    """A health Check on a fresh connection every ``PROBE_EVERY_S`` until ``end``; the
    probes slower than ``SLOW_PROBE_S`` go to ``slow`` as (seconds into the phase, ms)."""
    took: list[float] = []
    start = time.monotonic()
    while time.monotonic() < end:
        t0 = time.monotonic()
        async with aio.insecure_channel(address) as ch:
            resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                             timeout=30)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        took.append(time.monotonic() - t0)
        if slow is not None and took[-1] > SLOW_PROBE_S:
            slow.append((round(t0 - start, 2), round(took[-1] * 1e3, 1)))
        await asyncio.sleep(max(0.0, PROBE_EVERY_S - (time.monotonic() - t0)))
    return took


def _ms(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1e3, 1)


async def phase(address: str, token: str, n_frames: int, args: argparse.Namespace,
                pids: dict[str, int], kind: str | None) -> dict[str, Any]:
    """Authenticated Generate latency and health probes for ``args.seconds``, beside an
    attacker of ``kind`` (None: alone)."""
    metadata = (("authorization", f"Bearer {token}"),)
    attacker = None
    meter = CpuMeter({**pids, "clients": os.getpid()})
    if kind is not None:
        attacker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.bench_stream_flood", "--attack", kind,
            "--address", address, "--seconds", str(args.seconds + 2),
            stdout=asyncio.subprocess.PIPE, cwd=str(Path(__file__).resolve().parent.parent))
        await asyncio.sleep(1.0)  # the attacker starts and opens its streams
        meter.add("attacker", attacker.pid)
    failures: list[str] = []
    slow: list[tuple[float, float]] = []
    async with aio.insecure_channel(address, options=channel_options()) as ch:
        stub = verifier_pb2_grpc.VerifierStub(ch)
        first = open_message(n_frames)

        async def generate() -> None:
            async for msg in stub.Generate(iter([first]), timeout=60, metadata=metadata):
                if msg.WhichOneof("kind") == "done":
                    return
            raise RuntimeError("a Generate ended without Done")

        end = time.monotonic() + args.seconds
        took, health = await asyncio.gather(
            loop_requests(generate, args.clients, args.seconds, failures),
            probe_health(address, end, slow))
    out: dict[str, Any] = {
        "generates": len(took), "generate_p50_ms": _ms(took, 0.5),
        "generate_p90_ms": _ms(took, 0.9), "generate_failed": failures[:5],
        "generate_failed_count": len(failures),
        "health_samples": len(health), "health_p50_ms": _ms(health, 0.5),
        "health_p100_ms": round(max(health) * 1e3, 1) if health else None,
        "health_slow_s_ms": slow,
        "cpu_s": meter.used()}
    if attacker is not None:
        raw, _ = await attacker.communicate()
        out["attacker"] = json.loads(raw)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    token = secrets.token_hex(16)
    out: dict[str, Any] = {"clients": args.clients, "seconds": args.seconds,
                           "probe_every_s": PROBE_EVERY_S, "cpus": os.cpu_count(),
                           "load_avg_1m_at_start": os.getloadavg()[0]}
    async with nodes() as n:
        tokens = n.tmp / "tokens"
        tokens.write_text(f"bench:{token}\n")
        address = f"127.0.0.1:{await n.cloud('c', '--token-file', str(tokens))}"
        pids = {"cloud": n.proc(0).pid}
        async with aio.insecure_channel(address) as ch:
            info = await verifier_pb2_grpc.VerifierStub(ch).GetServerInfo(
                verifier_pb2.GetServerInfoRequest(), timeout=30,
                metadata=(("authorization", f"Bearer {token}"),))
        n_frames = int(info.geometry.num_frames)
        for kind in ("alone", "refused", "stalled"):
            if kind not in args.phases:
                continue
            out[kind] = await phase(address, token, n_frames, args, pids,
                                    None if kind == "alone" else kind)
            print(json.dumps({kind: out[kind]}), flush=True)
            await asyncio.sleep(2.0)  # the attacker's leftovers end
    base = out.get("alone", {}).get("generate_p50_ms")
    for kind in ("refused", "stalled"):
        if base and kind in out and out[kind]["generate_p50_ms"]:
            out[kind]["generate_ratio"] = round(out[kind]["generate_p50_ms"] / base, 2)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", type=int, default=2, help="authenticated Generate callers")
    p.add_argument("--seconds", type=float, default=15.0, help="each phase's length")
    p.add_argument("--phases", default="alone,refused,stalled")
    p.add_argument("--out", type=Path, default=None)
    # The attacker process's own arguments.
    p.add_argument("--attack", choices=("refused", "stalled"), default=None,
                   help=argparse.SUPPRESS)
    p.add_argument("--address", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.attack is not None:
        with contextlib.suppress(KeyboardInterrupt):
            print(json.dumps(await attack(args.address, args.attack, args.seconds)), flush=True)
        return 0
    args.phases = set(args.phases.split(","))
    result = await run(args)
    if args.out is not None:
        write_result(args.out, result, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
