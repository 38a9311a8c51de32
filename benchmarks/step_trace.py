"""Chrome traces of the cloud's B = 1, k = 0 step (``bench_engine --trace-dir DIR``;
issue 39: "profile and commit the trace").

Why a trace beside the kernel table of ``bench_engine.profile_step``: the table sums
device time by kernel, over an eager step; a trace shows the step as the server runs it,
host and device on one time line, so the step's ms beyond its kernels (staging the batch,
the launch, gathering the logits, the sync) can be seen and not only inferred.

Two gzip-compressed chrome trace JSON files, which chrome://tracing and ui.perfetto.dev
open as they are:

- ``trace-step-b1-k0-graphed-<card>.json.gz``: ``engine.step`` with its CUDA graphs kept,
  a few warm steps first, then :data:`STEPS` traced, a device sync after each. The graph
  replays as one launch (``cudaGraphLaunch``) on the host; that one launch where the eager
  trace has hundreds is expected, and is what the graph buys.
- ``trace-step-b1-k0-eager-<card>.json.gz``: one step with the graphs set aside, every
  kernel launched on its own.

A sidecar ``trace-step-b1-k0-<card>.json``, stamped as every result is, lists both files,
their sizes and the wall ms of each traced step (the profiler on, so above the untraced
step's ms). Machine paths in the traces (the trace's own file name) are scrubbed, as in
every committed result. Without CUDA (the tiny CPU run) only host activity is traced.
"""

from __future__ import annotations

import gzip
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.device_timing import sync
from benchmarks.stamp import scrub_paths, write_result
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.buckets import bucket

#: Untraced steps before each trace (first-call allocations and lazy set-up stay out).
WARMUP = 2
#: Graphed steps traced; a few, so one replay can be told from the next.
STEPS = 3


@contextmanager
def without_graphs(engine: StaticEngine) -> Iterator[None]:
    """The engine's steps eager inside the block (no captured graph to replay), its graphs
    back after, even on an error."""
    graphs, engine.step_graphs = engine.step_graphs, {}
    try:
        yield
    finally:
        engine.step_graphs = graphs


def write_step_traces(engine: StaticEngine, ctx: int, out_dir: Path, card: str,
                      warmup: int = WARMUP, steps: int = STEPS) -> dict[str, Any]:
    """Trace the B = 1, k = 0 step at context ``ctx`` on slot 0 (live, holding at least
    ``ctx`` positions), graphed then eager; write both traces and their sidecar into
    ``out_dir``; return the sidecar's body."""
    out_dir.mkdir(parents=True, exist_ok=True)
    batch = StepBatch((0,), (ctx,), (1,), torch.randint(5, 500, (1,), device=engine.device))
    key = (bucket(1, engine.session_buckets), bucket(1, engine.token_buckets))
    traces = [_trace(engine, batch, "graphed", out_dir, card, warmup, steps)]
    traces[0]["graph_replayed"] = key in engine.step_graphs
    with without_graphs(engine):
        traces.append(_trace(engine, batch, "eager", out_dir, card, warmup, 1))
    body = {"B": 1, "k": 0, "context": ctx, "warmup_steps": warmup, "traces": traces}
    write_result(out_dir / f"trace-step-b1-k0-{card}.json", body)
    return body


def _trace(engine: StaticEngine, batch: StepBatch, mode: str, out_dir: Path, card: str,
           warmup: int, steps: int) -> dict[str, Any]:
    """``steps`` traced calls of ``engine.step(batch)``, each named ``step#i`` in the trace
    and timed to a device sync; the gzip file written and described."""
    for _ in range(warmup):
        engine.step(batch)
    sync()
    activities = [ProfilerActivity.CPU]
    if engine.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    times = []
    with profile(activities=activities) as prof:
        for i in range(steps):
            t0 = time.perf_counter()
            with record_function(f"step#{i}"):
                engine.step(batch)
                sync()
            times.append((time.perf_counter() - t0) * 1e3)
    path = out_dir / f"trace-step-b1-k0-{mode}-{card}.json.gz"
    with tempfile.TemporaryDirectory() as tmp:  # no unstamped .json left in out_dir
        raw = Path(tmp, "trace.json")
        prof.export_chrome_trace(str(raw))
        text = scrub_paths(raw.read_text())
    path.write_bytes(gzip.compress(text.encode(), mtime=0))
    return {"mode": mode, "file": path.name, "bytes": path.stat().st_size,
            "steps": steps, "step_ms": times, "step_ms_median": statistics.median(times)}
