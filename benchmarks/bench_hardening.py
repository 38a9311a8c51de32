"""Issue 19's load and fault goals, measured with real processes on loopback (toy models).

Each scenario starts ``eventspec-cloud serve`` and ``eventspec-edge serve`` processes the
way a user does (``eventspec.shared.client.launch``), asks through ``EdgeClient``, and writes one
JSON:

- ``spread``: two cloud replicas behind one edge (``--cloud A,B``), 60 Asks in turn:
  how many Generate streams each replica served (from its request log).
- ``sigstop``: two replicas and 4 clients asking in a loop; after 10 s one replica is
  SIGSTOPped for ``--stop-s`` seconds: the share of Asks hurt (failed, or failed over
  after waiting ``--cloud-first-reply-s`` for a Plan), the share slower than 2x the
  median before the stop (half the capacity is gone), and the slowest Ask against its
  deadline.
- ``recovery``: the cloud is stopped for ``--outage-s`` seconds and started again on the
  same port: seconds from its SERVING to the edge's SERVING and to the first answer.
- ``load``: 50 clients ask in a loop for ``--load-s`` seconds against a cloud with 8
  sessions: answered within the deadline, refused, failed.
- ``stops``: 4 clients' median latency alone, then while another process keeps sending
  Asks with 10^6 one-character stop strings (refused: at most 16 are allowed). Both
  share this machine's 2 cores, so the attacker's own CPU counts against the others.

    python -m benchmarks.bench_hardening --out benchmarks/results/hardening-cpu.json

The clouds are paced (50 ms prefill, 10 ms per step) so an Ask takes a while, as on a
GPU server, and the toy models' CPU time does not dominate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.client.launch import start_node, stop_node, wait_for_port
from eventspec.shared.contract.types import AskSpec, GenerationSettings, Mode
from eventspec.shared.wire.health import wait_for_serving

ASK = AskSpec(question="Which way is the object moving?", mode=Mode.SPECULATIVE,
              generation=GenerationSettings(max_new_tokens=16))
PACE = ["--emulate-prefill-ms", "50", "--emulate-step-ms", "10"]
#: The edge's --cloud-first-reply-s (its default).
FIRST_REPLY_S = 5.0


class Nodes:
    """Processes started in a scratch directory, all stopped on exit."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    async def cloud(self, name: str, *extra: str, port: int = 0) -> int:
        proc = start_node("eventspec-cloud", [
            "serve", "--model", "toy", "--port", str(port), "--port-file",
            str(self.tmp / f"{name}.port"), *PACE, *extra],
            self.tmp / f"{name}.log")
        self.procs.append(proc)
        got = await wait_for_port(proc, self.tmp / f"{name}.port", self.tmp / f"{name}.log", 120)
        await wait_for_serving(f"127.0.0.1:{got}", 120)
        return got

    async def edge(self, cloud: str, *extra: str) -> int:
        proc = start_node("eventspec-edge", [
            "serve", "--cloud", cloud, "--model", "toy", "--port", "0", "--port-file",
            str(self.tmp / "edge.port"), *extra], self.tmp / "edge.log")
        self.procs.append(proc)
        port = await wait_for_port(proc, self.tmp / "edge.port", self.tmp / "edge.log", 120)
        await wait_for_serving(f"127.0.0.1:{port}", 120)
        return port

    def proc(self, i: int) -> subprocess.Popen[bytes]:
        return self.procs[i]

    def served(self, name: str) -> int:
        """Generate requests a cloud finished, from its request log."""
        text = (self.tmp / f"{name}.log").read_text(errors="replace")
        return sum(1 for line in text.splitlines()
                   if "eventspec.cloud.requests.log: generate" in line
                   and (", EOS," in line or ", MAX_TOKENS," in line))

    def stop_all(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)
            stop_node(p)


@contextlib.asynccontextmanager
async def nodes() -> AsyncIterator[Nodes]:
    with tempfile.TemporaryDirectory(prefix="bench-hardening-") as tmp:
        n = Nodes(Path(tmp))
        try:
            yield n
        finally:
            n.stop_all()


async def timed_ask(client: EdgeClient, spec: AskSpec = ASK) -> tuple[float, str]:
    started = time.monotonic()
    try:
        await client.ask_final(spec)
        outcome = "ok"
    except AskError as exc:
        outcome = exc.code.name
    return time.monotonic() - started, outcome


async def spread(asks: int) -> dict[str, object]:
    async with nodes() as n:
        a, b = await n.cloud("a"), await n.cloud("b")
        port = await n.edge(f"127.0.0.1:{a},127.0.0.1:{b}")
        async with EdgeClient(f"127.0.0.1:{port}", timeout_s=60) as client:
            outcomes = [(await timed_ask(client))[1] for _ in range(asks)]
        await asyncio.sleep(0.5)  # the last request's log line
        served = [n.served("a"), n.served("b")]
    return {"asks": asks, "ok": outcomes.count("ok"), "served_per_replica": served,
            "shares": [round(s / max(1, sum(served)), 3) for s in served]}


async def sigstop(stop_s: float, clients: int, deadline_s: float) -> dict[str, object]:
    """Ask with ``clients`` clients for 10 s, then SIGSTOP one replica for ``stop_s``."""
    async with nodes() as n:
        a, b = await n.cloud("a"), await n.cloud("b")
        port = await n.edge(f"127.0.0.1:{a},127.0.0.1:{b}")
        async with EdgeClient(f"127.0.0.1:{port}", timeout_s=deadline_s) as client:

            async def ask_for(seconds: float, into: list[tuple[float, float, str]],
                              t0: float) -> None:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    took, outcome = await timed_ask(client)
                    into.append((round(time.monotonic() - t0, 2), round(took, 3), outcome))

            before: list[tuple[float, float, str]] = []
            t0 = time.monotonic()
            await asyncio.gather(*(ask_for(10.0, before, t0) for _ in range(clients)))
            frozen = n.proc(1)
            frozen.send_signal(signal.SIGSTOP)
            during: list[tuple[float, float, str]] = []
            t0 = time.monotonic()
            await asyncio.gather(*(ask_for(stop_s, during, t0) for _ in range(clients)))
            frozen.send_signal(signal.SIGCONT)
    median = statistics.median(took for _, took, _ in before)
    failed = [r for r in during if r[2] != "ok"]
    # What the fault costs an Ask: a failure, or a failover (it waited for a Plan that
    # never came). Losing half the capacity also slows every Ask under the same load:
    # reported separately, against the median with the same clients before the stop.
    failed_over = [r for r in during if r[2] == "ok" and r[1] >= FIRST_REPLY_S]
    slower = [r for r in during if r[2] != "ok" or r[1] > 2 * median]
    return {"stop_s": stop_s, "clients": clients, "deadline_s": deadline_s,
            "first_reply_s": FIRST_REPLY_S, "asks_before": len(before),
            "median_before_ms": round(median * 1e3, 1), "asks": len(during),
            "failed": len(failed), "failed_over": len(failed_over),
            "hurt_share": round((len(failed) + len(failed_over)) / max(1, len(during)), 3),
            "slower_than_2x_median_share": round(len(slower) / max(1, len(during)), 3),
            "median_during_ms": round(statistics.median(r[1] for r in during) * 1e3, 1),
            "slowest_s": round(max(r[1] for r in during), 2),
            "timeline_end_s_took_s_outcome": sorted(r for r in during if r[1] >= 1.0)}


async def recovery(outage_s: float) -> dict[str, object]:
    async with nodes() as n:
        cport = await n.cloud("c")
        port = await n.edge(f"127.0.0.1:{cport}")
        async with EdgeClient(f"127.0.0.1:{port}", timeout_s=60) as client:
            assert (await timed_ask(client))[1] == "ok"
            stop_node(n.proc(0))
            await asyncio.sleep(outage_s)
            await n.cloud("c2", port=cport)
            back = time.monotonic()
            await wait_for_serving(f"127.0.0.1:{port}", 60)
            edge_serving = time.monotonic() - back
            while (await timed_ask(client))[1] != "ok":
                await asyncio.sleep(0.05)
            answered = time.monotonic() - back
    return {"outage_s": outage_s, "edge_serving_after_s": round(edge_serving, 2),
            "first_answer_after_s": round(answered, 2)}


async def load(seconds: float, clients: int, deadline_s: float) -> dict[str, object]:
    async with nodes() as n:
        cport = await n.cloud("c", "--max-sessions", "8")
        port = await n.edge(f"127.0.0.1:{cport}")
        outcomes: list[tuple[float, str]] = []
        end = time.monotonic() + seconds

        async def worker() -> None:
            async with EdgeClient(f"127.0.0.1:{port}", timeout_s=deadline_s) as client:
                while time.monotonic() < end:
                    outcomes.append(await timed_ask(client))

        await asyncio.gather(*(worker() for _ in range(clients)))
    ok = [t for t, o in outcomes if o == "ok" and t <= deadline_s]
    by_code: dict[str, int] = {}
    for _, o in outcomes:
        by_code[o] = by_code.get(o, 0) + 1
    return {"seconds": seconds, "clients": clients, "deadline_s": deadline_s,
            "asks": len(outcomes), "answered_in_deadline": len(ok),
            "answered_share": round(len(ok) / max(1, len(outcomes)), 3), "outcomes": by_code,
            "latency_p50_s": round(statistics.median(t for t, _ in outcomes), 2)}


ATTACKER = """
import asyncio, sys, time
from dataclasses import replace
from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.contract.types import AskSpec, GenerationSettings, Mode
port, seconds = sys.argv[1], float(sys.argv[2])
huge = AskSpec(question="What is moving?", mode=Mode.SPECULATIVE, generation=GenerationSettings(
    max_new_tokens=16, stop=tuple("abcdefgh"[i % 8] for i in range(1_000_000))))
async def main():
    codes, took = [], []
    async with EdgeClient(f"127.0.0.1:{port}", timeout_s=60) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                await client.ask_final(huge)
                codes.append("OK")
            except AskError as exc:
                codes.append(exc.code.name)
            took.append(time.monotonic() - t0)
    print(len(codes), sorted(set(codes)), sorted(took)[len(took) // 2])
asyncio.run(main())
"""


async def stops(seconds: float, clients: int) -> dict[str, object]:
    """Other clients' latency alone, then while another process keeps sending Asks with
    10^6 one-character stop strings (3 MB; refused: at most 16 are allowed)."""
    async with nodes() as n:
        cport = await n.cloud("c")
        port = await n.edge(f"127.0.0.1:{cport}")

        async def normal(into: list[float], end: float) -> None:
            async with EdgeClient(f"127.0.0.1:{port}", timeout_s=60) as client:
                while time.monotonic() < end:
                    took, outcome = await timed_ask(client)
                    if outcome == "ok":
                        into.append(took)

        alone: list[float] = []
        end = time.monotonic() + seconds
        await asyncio.gather(*(normal(alone, end) for _ in range(clients)))
        attacker = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ATTACKER, str(port), str(seconds),
            stdout=asyncio.subprocess.PIPE, cwd=str(Path(__file__).resolve().parent.parent))
        beside: list[float] = []
        end = time.monotonic() + seconds
        await asyncio.gather(*(normal(beside, end) for _ in range(clients)))
        out, _ = await attacker.communicate()
    count, codes, median_refused = out.decode().strip().split(" ", 1)[0], *out.decode(
    ).strip().split(" ", 1)[1].rsplit(" ", 1)
    return {"clients": clients, "seconds": seconds,
            "median_alone_ms": round(statistics.median(alone) * 1e3, 1),
            "median_beside_attacker_ms": round(statistics.median(beside) * 1e3, 1),
            "ratio": round(statistics.median(beside) / statistics.median(alone), 3),
            "attacks": int(count), "attack_outcomes": codes,
            "attack_refused_median_ms": round(float(median_refused) * 1e3, 1)}


async def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="spread,sigstop,recovery,load,stops")
    p.add_argument("--stop-s", type=float, default=30.0)
    p.add_argument("--outage-s", type=float, default=40.0)
    p.add_argument("--load-s", type=float, default=60.0)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    out: dict[str, object] = {"machine": os.uname().nodename, "cpus": os.cpu_count(),
                              "load_avg_1m_at_start": os.getloadavg()[0]}
    chosen = set(args.only.split(","))
    if "spread" in chosen:
        out["spread"] = await spread(60)
        print(json.dumps({"spread": out["spread"]}), flush=True)
    if "sigstop" in chosen:
        out["sigstop"] = await sigstop(args.stop_s, 4, 30.0)
        print(json.dumps({"sigstop": out["sigstop"]}), flush=True)
    if "recovery" in chosen:
        out["recovery"] = await recovery(args.outage_s)
        print(json.dumps({"recovery": out["recovery"]}), flush=True)
    if "load" in chosen:
        out["load"] = await load(args.load_s, 50, 30.0)
        print(json.dumps({"load": out["load"]}), flush=True)
    if "stops" in chosen:
        out["stops"] = await stops(20.0, 4)
        print(json.dumps({"stops": out["stops"]}), flush=True)
    if args.out is not None:
        if args.out.exists() and chosen != set(p.get_default("only").split(",")):
            out = {**json.loads(args.out.read_text()), **out}  # one scenario re-run
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
