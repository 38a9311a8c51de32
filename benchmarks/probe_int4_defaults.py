"""Why the int4 drafter drafted at 41 ms a token in the GPU gate's edge process (its
defaults: two slots of 4,096 positions, dense weights released after quantising) when
``bench_edge`` measured about 3.3 ms (one backend of 2,048 positions, weights kept).

Times one draft token (the greedy step the edge's ``DraftCache`` takes) for the full-size
drafter in int4 under each difference alone, CUDA graphs on, median of 30 after a
warm-up, and writes ``probe-int4-defaults-<device>.json``.

    PYTHONPATH=.eventspec-tree:. python3 -m benchmarks.probe_int4_defaults --out DIR
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.stamp import write_result
from eventspec.edge.drafting.static_backend import StaticDraftBackend, draft_backend_for
from eventspec.shared.node.static.quant import QuantMode
from tests.support.fullsize import build_full_draft


def ms_per_token(backend: Any, draft: Any, tokens: int = 30) -> dict[str, float]:
    """Prefill once (random pixels), then ``tokens`` single-token steps, each synced."""
    pixels = torch.randn(5, 3, 336, 336, device="cuda", dtype=torch.bfloat16)
    state, logits = backend.prefill("What is moving?", pixels)
    tok = backend.greedy_next(logits)
    times = []
    for _ in range(tokens + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        rows = backend.step(state, [tok])
        tok = backend.greedy_next(rows[-1])
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    graphs = len(getattr(backend.runtime, "_graphs", {})) if hasattr(backend, "runtime") else 0
    return {"ms_per_token_p50": statistics.median(times[3:]), "graphs": float(graphs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    draft = build_full_draft("cuda")
    rows: dict[str, dict[str, float]] = {}
    for name, kwargs in (("bench_edge: 2,048 positions, 2 slots", {"max_seq_len": 2048}),
                         ("4,096 positions, 2 slots", {"max_seq_len": 4096})):
        backend = StaticDraftBackend(draft, quant=QuantMode.INT4, **kwargs)
        backend.warm_up()
        rows[name] = ms_per_token(backend, draft)
        print(name, rows[name], flush=True)
        del backend
        torch.cuda.empty_cache()
    backend = draft_backend_for("auto", draft, QuantMode.INT4)  # the edge's own path
    rows["the edge's defaults (draft_backend_for: weights released)"] = ms_per_token(backend,
                                                                                    draft)
    print(rows, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name().split()[1].lower()
    write_result(args.out / f"probe-int4-defaults-{device}.json", {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
