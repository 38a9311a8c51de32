"""KV by length against fixed slots under mixed request lengths: a discrete-event
simulation of the admission path alone (``cloud/scheduling/kv_arena.py``'s allocator and the KV
queue's first-come-first-served rule), no model.

Why a simulation: the GPU runs used requests of one length, where a first-fit arena
cannot fragment much. Here each mix of answer caps (``--mixes``; a 2,103-token video
prompt plus a 10-40-token question each) arrives as a Poisson stream faster than it is
served, and each request holds its KV for a time proportional to its answer (the cap:
the worst case). Reported for three layouts: KV by length as built (first fit), fixed
slots in the same memory, and the bound of a layout that never fragments (paged KV, or
an arena compacted whenever the head does not fit): requests served per second of
simulated time, mean sessions holding KV, and waits in the queue.

    python -m benchmarks.bench_kv_arena [--requests 4000] [--rate 40] [--out PATH]

The defaults use the H100 run's arena (116,653 positions) and its slot size (2,845):
``benchmarks/results/capacity-h100-by-length-t128.json``.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.stamp import write_result
from eventspec.cloud.scheduling.kv_arena import PositionArena

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Request:
    arrival_s: float
    positions: int  # prompt + question + answer cap
    hold_s: float  # how long it keeps its KV once admitted


def workload(n: int, rate: float, caps: list[int], prompt: int, ms_per_token: float,
             prefill_ms: float, seed: int) -> list[Request]:
    """``n`` Poisson arrivals at ``rate``/s, each a random question and answer cap."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        cap = rng.choice(caps)
        out.append(Request(t, prompt + rng.randint(10, 40) + cap,
                           (prefill_ms + cap * ms_per_token) / 1e3))
    return out


class NeverFragments:
    """The bound: a request fits whenever enough positions are free in total."""

    def __init__(self, size: int) -> None:
        self.free_positions = size
        self._taken: dict[int, int] = {}

    def allocate(self, length: int) -> int | None:
        if self.free_positions < length:
            return None
        start = len(self._taken) and max(self._taken) + 1
        self._taken[start] = length
        self.free_positions -= length
        return start

    def release(self, start: int) -> int:
        length = self._taken.pop(start)
        self.free_positions += length
        return length


def simulate(requests: list[Request], *, arena: int, slot: int | None,
             max_sessions: int, ideal: bool = False) -> dict[str, Any]:
    """Admit FIFO: by length (``slot`` None) a first-fit run of each request's positions
    (``ideal``: any free positions), else one of ``arena // slot`` slots; at most
    ``max_sessions`` at once."""
    slots = arena // slot if slot is not None else 0
    pool: PositionArena | NeverFragments | None = None
    if slot is None:
        pool = NeverFragments(arena) if ideal else PositionArena(arena)
    free_slots = slots
    queue: deque[Request] = deque()
    ends: list[tuple[float, int, int]] = []  # (end time, request index, run start)
    index = {id(r): i for i, r in enumerate(requests)}
    held, waits, fragmented, in_flight_area, last_t = 0, [], 0, 0.0, 0.0
    pending = deque(requests)
    served = 0
    now = 0.0

    def admit(now: float) -> None:
        nonlocal held, free_slots, fragmented
        while queue and held < max_sessions:
            head = queue[0]
            if pool is None:
                if free_slots == 0:
                    return
                free_slots -= 1
                start = -1
            else:
                got = pool.allocate(head.positions)
                if got is None:
                    if pool.free_positions >= head.positions:
                        fragmented += 1
                    return
                start = got
            queue.popleft()
            held += 1
            waits.append(now - head.arrival_s)
            heapq.heappush(ends, (now + head.hold_s, index[id(head)], start))

    while pending or ends:
        next_arrival = pending[0].arrival_s if pending else float("inf")
        next_end = ends[0][0] if ends else float("inf")
        now = min(next_arrival, next_end)
        in_flight_area += held * (now - last_t)
        last_t = now
        if next_end <= next_arrival:
            _, _, start = heapq.heappop(ends)
            held -= 1
            served += 1
            if pool is None:
                free_slots += 1
            else:
                pool.release(start)
        else:
            queue.append(pending.popleft())
        admit(now)
    layout = f"slots of {slot}" if slot is not None else (
        "never fragments (bound)" if ideal else "by-length (first fit)")
    return {
        "layout": layout,
        "slots": slots if slot is not None else None,
        "served": served,
        "requests_per_s": round(served / now, 2),
        "mean_sessions_holding_kv": round(in_flight_area / now, 2),
        "mean_wait_s": round(statistics.fmean(waits), 3),
        "p99_wait_s": round(sorted(waits)[int(0.99 * (len(waits) - 1))], 3),
        # Admission attempts where the head did not fit although enough positions
        # were free in total.
        "head_blocked_by_fragmentation": fragmented if slot is None else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--rate", type=float, default=40.0, help="arrivals per second")
    p.add_argument("--mixes", nargs="+", default=["128", "64,128", "128,256", "32,128,512",
                                                   "32,512"],
                   help="answer-cap mixes, each comma-separated (caps drawn uniformly)")
    p.add_argument("--prompt", type=int, default=2103)
    p.add_argument("--arena", type=int, default=116_653)
    p.add_argument("--slot", type=int, default=2845)
    p.add_argument("--max-sessions", type=int, default=64)
    p.add_argument("--ms-per-token", type=float, default=40.0,
                   help="decode time per answer token at load (the H100's 64-session "
                        "level was 47 ms)")
    p.add_argument("--prefill-ms", type=float, default=70.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "kv-arena-sim.json")
    args = p.parse_args(argv)
    runs = []
    for mix in args.mixes:
        caps = [int(c) for c in mix.split(",")]
        reqs = workload(args.requests, args.rate, caps, args.prompt, args.ms_per_token,
                        args.prefill_ms, args.seed)
        for run in (
            simulate(reqs, arena=args.arena, slot=None, max_sessions=args.max_sessions),
            # The same budget in slots: the arena plus its padding window, less one slot
            # for padding, is arena // slot slots.
            simulate(reqs, arena=args.arena, slot=args.slot, max_sessions=args.max_sessions),
            simulate(reqs, arena=args.arena, slot=None, max_sessions=args.max_sessions,
                     ideal=True),
        ):
            runs.append({"caps": caps, **run})
    result = {"what": "admission-only simulation of KV by length vs fixed slots, mixed "
                      "answer caps, Poisson arrivals (no model)",
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, result, indent=2)
    print("\n".join(readme_rows(result)))
    return 0


def readme_rows(result: dict[str, Any]) -> list[str]:
    """README rows: per cap mix and layout, sessions holding KV and requests per second."""
    return [f"| {', '.join(map(str, r['caps']))} | {r['layout']} | "
            f"{r['mean_sessions_holding_kv']:.1f} | {r['requests_per_s']:.2f} | "
            f"{r['mean_wait_s']:.0f} |" for r in result["runs"]]


if __name__ == "__main__":
    raise SystemExit(main())
