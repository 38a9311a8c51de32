"""Where the engine thread's host time goes per step, from a raw ``py-spy`` profile.

    python tools/pyspy_steps.py benchmarks/results/pyspy-load-b1-h200-2274699.txt.gz \
        --load benchmarks/results/load-h200-handover-profiled-b1.json

The profile is ``py-spy record --nonblocking --threads -r RATE -f raw`` of a
``bench_load`` run (one line per distinct stack: frames joined by ``;``, then a sample
count). Only the ``engine-core`` thread's samples inside ``EngineLoop._iterate`` count.
Each is put in the first bucket below whose function is on its stack, the wait for the
device first, and reported as milliseconds per engine step: samples / RATE / steps,
where the steps are the load run's (its ``step_kinds``). Sampling error is about the
square root of a bucket's samples.

Why a script: the per-step figures in ``docs/results/load-gpu.md`` ("The engine loop's
host work, overlapped") come from it, so anyone can re-derive them from the committed
profiles.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections import Counter
from pathlib import Path

#: (bucket, the frame that puts a sample in it); the first match wins. A wait is a leaf.
WAITS = (
    ("wait: the sampler's pageable index copy", "_padded_rows_and_drafts", 195),
    ("wait: the verdicts' event", "Event.synchronize", None),
    ("wait: commands (idle)", "SimpleQueue.get", None),
)
BUCKETS = (
    ("prefill calls of their own", "PrefillCalls.run"),
    ("sampler (host side)", "BatchedSampler.__call__"),
    ("sampler (host side)", "BatchedSampler.launch"),
    ("loading the step (staging)", "StepStaging.load"),
    ("graph replay launch", "CUDAGraph.replay"),
    ("the rest of the engine call", "StaticRuntime.step"),
    ("the rest of the engine call", "StaticEngine.step_with_chunks"),
    ("batch_of (token ids to the device)", "batch_of"),
    ("towers ahead", "EngineLoop._start_towers"),
    ("first tokens of riding pieces", "PrefillCalls.after_pieces"),
    ("commits (update_step)", "StepScheduler.update_step"),
    ("planning (schedule_step)", "StepScheduler.schedule_step"),
    ("planning (schedule_prefill)", "StepScheduler.schedule_prefill"),
    ("recording the step", "EngineLoop._record_step"),
    ("hand-over (Outbox.flush)", "Outbox.flush"),
    ("commands", "StepScheduler.take_commands"),
)
FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>.*):(?P<line>\d+)\)$")


def _frames(stack: str) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = []
    for f in stack.split(";"):
        m = FRAME.match(f)
        out.append((m["name"], int(m["line"])) if m else (f, None))
    return out


def bucket_of(frames: list[tuple[str, int | None]]) -> str:
    """The bucket of one engine-thread stack (innermost frame last)."""
    leaf, line = frames[-1]
    for name, fn, at in WAITS:
        if leaf == fn and (at is None or line == at):
            return name
    names = {n for n, _ in frames}
    for name, fn in BUCKETS:
        if fn in names:
            return name
    return "other"


def summarise(lines: list[str]) -> Counter[str]:
    """Samples per bucket, over the engine thread's stacks inside its iterations."""
    counts: Counter[str] = Counter()
    for line in lines:
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if "engine-core" not in stack.split(";", 1)[0] or "EngineLoop._iterate" not in stack:
            continue
        counts[bucket_of(_frames(stack))] += int(n)
    return counts


def within(lines: list[str], function: str) -> Counter[str]:
    """Engine-thread samples under ``function``, by the frame it called (itself: its own
    lines)."""
    counts: Counter[str] = Counter()
    for line in lines:
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if "engine-core" not in stack.split(";", 1)[0]:
            continue
        frames = _frames(stack)
        names = [name for name, _ in frames]
        if function in names:
            i = names.index(function)
            callee = frames[i + 1] if i + 1 < len(frames) else frames[i]
            counts[f"{callee[0]}:{callee[1]}"] += int(n)
    return counts


def load_steps(path: Path) -> int:
    """Engine steps of a ``bench_load`` run, over every configuration and level."""
    result = json.loads(path.read_text())
    return sum(k["steps"] for c in result["configs"] for lv in c["levels"]
               for k in lv["step_kinds"]["kinds"].values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("profile", type=Path, help="py-spy raw output (.gz or plain)")
    ap.add_argument("--load", type=Path, required=True, help="the bench_load JSON it profiled")
    ap.add_argument("--rate", type=float, default=250.0, help="py-spy's samples a second")
    ap.add_argument("--within", metavar="FUNCTION",
                    help="instead, split one function's samples by what it called, e.g. "
                         "StepStaging.load")
    args = ap.parse_args(argv)
    opener = gzip.open if args.profile.suffix == ".gz" else open
    with opener(args.profile, "rt") as f:
        lines = f.readlines()
    counts = within(lines, args.within) if args.within else summarise(lines)
    steps = load_steps(args.load)
    total = sum(counts.values())
    print(f"{steps} steps, {total} engine-thread samples ({total / args.rate:.1f} s)")
    print(f"{'ms / step':>9} {'samples':>8}  bucket")
    for name, n in counts.most_common():
        print(f"{n / args.rate / steps * 1e3:9.3f} {n:8d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
