"""The engine loop's own cost per step, with an engine that costs nothing (issue 23).

On an H200 the in-server step was 1.12-1.38x the engine's device time at 16-64
sessions (``load-h200-*.json``): 0.7-4.1 ms a step outside the engine. This measures the
part that is the loop's Python alone: B greedy target-only sessions decode through the
real ``Scheduler`` and its sampler over an engine whose step returns a precomputed
logits view (a 64-token vocabulary, so the sampler's arithmetic is negligible too),
while the event loop drains every session's results as the server's streams would.
Reports per step: the whole iteration, the loop's own work (``overhead_ms``: batch
building, commits, bookkeeping), the sampler call and the engine call.

    python -m benchmarks.bench_scheduler_host --sessions 16 64 --steps 300

Writes ``benchmarks/results/scheduler-host-cpu.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.stamp import write_result
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.scheduling.scheduler import Scheduler
from eventspec.cloud.scheduling.tickets import Ticket
from eventspec.cloud.speculation.decoding import DecodingSession
from eventspec.shared.contract.types import GenerationSettings
from eventspec.shared.node.static.batch import StepBatch

VOCAB = 64
PROMPT = 10
RESULTS = Path(__file__).resolve().parent / "results"


class NullEngine:
    """A ``BatchedEngine`` whose calls cost nothing: logits one-hot at token 7."""

    def __init__(self, num_slots: int) -> None:
        self.device = torch.device("cpu")
        self.num_slots = num_slots
        self.max_seq_len = 1 << 20
        self._logits = torch.zeros(4096, VOCAB)  # [N, V]
        self._logits[:, 7] = 1.0

    def prefill(self, requests: Sequence[PrefillRequest]) -> torch.Tensor:
        return self._logits[: len(requests)]  # [R, V]

    def step(self, batch: StepBatch) -> torch.Tensor:
        return self._logits[: batch.num_tokens]  # [N, V]

    def free(self, slot: int) -> None:
        pass


def _session(steps: int) -> Any:
    def make(slot: int) -> DecodingSession:
        return DecodingSession(
            settings=GenerationSettings(max_new_tokens=steps + 1), slot=slot,
            prompt_len=PROMPT, max_seq_len=1 << 20, eos_token_id=2, max_verify_tokens=9,
            decode=lambda ids: "", speculative=False)
    return make


async def measure(sessions: int, steps: int) -> dict[str, float]:
    """``sessions`` requests decoding ``steps`` tokens each, all at once."""
    sched = Scheduler(NullEngine(sessions), text_vocab_size=VOCAB)
    sched.start()
    tickets: list[Ticket] = []
    try:
        for i in range(sessions):
            ticket = sched.admit(f"r{i}", _session(steps))
            sched.submit_prefill(ticket, list(range(3, 3 + PROMPT)),
                                 video_features=torch.zeros(1))
            tickets.append(ticket)

        async def drain(ticket: Ticket) -> None:
            while True:
                event = await ticket.events.get()
                if getattr(event, "finish_reason", None) is not None:
                    return

        t0 = time.perf_counter()
        await asyncio.gather(*(drain(t) for t in tickets))
        wall = time.perf_counter() - t0
    finally:
        await asyncio.to_thread(sched.stop)
    s = sched.stats
    n = max(1, s.steps)
    return {"sessions": sessions, "steps": s.steps, "iteration_ms": wall / n * 1e3,
            "overhead_ms": s.overhead_ms / n, "sampler_ms": s.sampler_ms / n,
            "engine_ms": s.engine_ms / n}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--steps", type=int, default=300, help="tokens each session decodes")
    ap.add_argument("--out", type=Path, default=RESULTS / "scheduler-host-cpu.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [asyncio.run(measure(b, args.steps)) for b in args.sessions]
    result = {"command": "python -m benchmarks.bench_scheduler_host "
                         + " ".join(sys.argv[1:] if argv is None else argv),
              "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, result)
    print(f"{'B':>4} {'iteration':>10} {'loop':>8} {'sampler':>8} {'engine':>8}  (ms per step)")
    for r in rows:
        print(f"{r['sessions']:>4} {r['iteration_ms']:>10.3f} {r['overhead_ms']:>8.3f} "
              f"{r['sampler_ms']:>8.3f} {r['engine_ms']:>8.3f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
