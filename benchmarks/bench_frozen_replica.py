"""Issue 38 (red-team finding 6): what a frozen cloud replica costs the Asks, measured with
real processes on loopback (toy models).

Two ``eventspec-cloud serve`` replicas behind one ``eventspec-edge serve --cloud A,B``.
After a few Asks reach both, replica B freezes and stays frozen while ``--clients``
clients make ``--asks`` Asks, each pausing ``--gap-s`` between its Asks so the run spans
several of the edge's rests (``--cloud-rest-s``, 30 s by default). Two kinds of freeze:

- ``--freeze sigstop``: B's process is SIGSTOPped. It keeps its socket (the kernel
  still accepts connections) and answers nothing, keepalive pings included, so the
  edge's keepalive drops its connection within 15 s;
- ``--freeze hang``: B is reached through ``tests.support.frozen_replica`` in this process,
  whose Verifier handlers stop answering while its health still says SERVING and its
  connection answers keepalive: a hung servicer, which keepalive never drops.

Reported: the share of Asks delayed more than 1 s, the share that waited the first-reply
timeout (they met the frozen replica), failures, and the slowest. Then B is thawed
(SIGCONT), and the Asks go on until B serves one again: how long that took.

    python -m benchmarks.bench_frozen_replica --out benchmarks/results/frozen-replica-cpu.json

The clouds are paced like ``bench_hardening``'s (50 ms prefill, 10 ms per step), so an
Ask takes a while, as on a GPU server. ``--edge-arg`` passes flags on to the edge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.bench_hardening import Nodes, nodes, timed_ask
from benchmarks.stamp import write_result
from eventspec.shared.client.edge_client import EdgeClient
from tests.support.frozen_replica import FreezableReplica

#: The edge's --cloud-first-reply-s (its default): an Ask this slow met the frozen replica.
FIRST_REPLY_S = 5.0
DELAYED_S = 1.0


class Freezer:
    """Freezes and thaws replica B, and counts the Generate requests it served."""

    def __init__(self, n: Nodes, hang: FreezableReplica | None) -> None:
        self.n, self.hang = n, hang

    def freeze(self) -> None:
        if self.hang is not None:
            self.hang.freeze()
        else:
            self.n.proc(1).send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.hang is not None:
            self.hang.thaw()
        else:
            self.n.proc(1).send_signal(signal.SIGCONT)

    def served(self) -> int:
        return self.n.served("b") if self.hang is None else self.hang.forwarded


async def frozen_run(edge_port: int, asks: int, clients: int, gap_s: float
                     ) -> list[tuple[float, float, str]]:
    """``asks`` Asks from ``clients`` clients while replica B is frozen: (start offset,
    seconds, outcome) each."""
    runs: list[tuple[float, float, str]] = []
    left = [asks]
    t0 = time.monotonic()

    async def client() -> None:
        async with EdgeClient(f"127.0.0.1:{edge_port}", timeout_s=60) as c:
            while left[0] > 0:
                left[0] -= 1
                at = time.monotonic() - t0
                took, outcome = await timed_ask(c)
                runs.append((round(at, 2), round(took, 3), outcome))
                await asyncio.sleep(gap_s)

    await asyncio.gather(*(client() for _ in range(clients)))
    return runs


async def back_after(b: Freezer, edge_port: int, limit_s: float) -> float | None:
    """Seconds from the thaw until replica B has served an Ask again (None: not within
    ``limit_s``)."""
    served = b.served()
    b.thaw()
    t0 = time.monotonic()
    async with EdgeClient(f"127.0.0.1:{edge_port}", timeout_s=60) as c:
        while time.monotonic() - t0 < limit_s:
            await timed_ask(c)
            await asyncio.sleep(0.2)  # the request log line
            if b.served() > served:
                return round(time.monotonic() - t0, 2)
    return None


def summary(runs: list[tuple[float, float, str]]) -> dict[str, object]:
    took = [t for _, t, _ in runs]
    delayed = [r for r in runs if r[1] > DELAYED_S or r[2] != "ok"]
    met = [r for r in runs if r[1] >= FIRST_REPLY_S]
    return {
        "asks": len(runs), "failed": sum(1 for r in runs if r[2] != "ok"),
        "delayed_over_1s": len(delayed), "delayed_share": round(len(delayed) / len(runs), 3),
        "waited_first_reply": len(met), "median_ms": round(statistics.median(took) * 1e3, 1),
        "slowest_s": round(max(took), 2), "span_s": round(max(a + t for a, t, _ in runs), 1),
        "delayed_at_s_took_s_outcome": sorted(delayed),
    }


async def run(args: argparse.Namespace) -> dict[str, object]:
    async with nodes() as n:
        a, b_port = await n.cloud("a"), await n.cloud("b")
        hang = FreezableReplica(f"127.0.0.1:{b_port}") if args.freeze == "hang" else None
        if hang is not None:
            b_port = await hang.start()
        b = Freezer(n, hang)
        try:
            port = await n.edge(f"127.0.0.1:{a},127.0.0.1:{b_port}", *args.edge_arg)
            async with EdgeClient(f"127.0.0.1:{port}", timeout_s=60) as client:
                for _ in range(6):  # both replicas serve before B freezes
                    assert (await timed_ask(client))[1] == "ok"
            b.freeze()
            runs = await frozen_run(port, args.asks, args.clients, args.gap_s)
            back = await back_after(b, port, args.back_limit_s)
        finally:
            if hang is not None:
                await hang.stop()
    return {"freeze": args.freeze, "asks": args.asks, "clients": args.clients,
            "gap_s": args.gap_s,
            "edge_args": list(args.edge_arg), "first_reply_s": FIRST_REPLY_S,
            "frozen": summary(runs), "served_again_after_sigcont_s": back}


async def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--freeze", choices=["sigstop", "hang"], default="sigstop")
    p.add_argument("--asks", type=int, default=100)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--gap-s", type=float, default=1.0)
    p.add_argument("--back-limit-s", type=float, default=60.0)
    p.add_argument("--edge-arg", action="append", default=[],
                   help="a flag for eventspec-edge serve (repeat; --edge-arg=--x=1)")
    p.add_argument("--label", default="", help="a name for this run in the JSON")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    result = {"label": args.label, "machine": os.uname().nodename, "cpus": os.cpu_count(),
              **await run(args)}
    print(json.dumps(result), flush=True)
    if args.out is not None:
        write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
