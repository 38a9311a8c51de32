"""PyTorch core's weight-only kernels on the 7B decoder's linear layers, against bf16.

Why: the drafter's ``--draft-quant`` picks its kernels from this (see
``shared/node/static/quant.py``). The 224 linear layers of a LLaMA-7B decoder plus the LM
head, random weights, at M = 1 and 8 rows, each variant replayed from one CUDA graph:
bf16 ``x @ w.T``; core's ``_weight_int8pack_mm``; int8 dequantised to bf16 then a
matmul; core's ``_weight_int4pack_mm`` (group 128, innerKTiles 8). GPU only.

    python -m benchmarks.probe_quant_kernels      # writes quant_kernels_<device>.json to $OUT
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from benchmarks.stamp import write_result

#: [N, K] of one decoder layer's projections (QKV, O, gate-up, down), 32 layers, LM head.
SHAPES = [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008)] * 32 + [(32000, 4096)]


def graph_ms(fn: Callable[[], None], repeats: int = 20) -> float:
    """Median ms of one replay of ``fn`` captured in a CUDA graph."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _each(ops: list[Callable[[], object]]) -> Callable[[], None]:
    def run() -> None:
        for op in ops:
            op()
    return run


def _bf16(xs: dict[int, torch.Tensor]) -> float:
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for n, k in SHAPES]
    return graph_ms(_each([partial(torch.matmul, xs[w.shape[1]], w.t()) for w in ws]))


def _int8(xs: dict[int, torch.Tensor]) -> tuple[float, float]:
    q8 = [(torch.randint(-127, 127, (n, k), device="cuda", dtype=torch.int8),
           torch.rand(n, device="cuda", dtype=torch.bfloat16)) for n, k in SHAPES]
    core = graph_ms(_each([partial(torch.ops.aten._weight_int8pack_mm, xs[q.shape[1]], q, s)
                           for q, s in q8]))

    def dequant(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (x @ q.t().to(torch.bfloat16)) * s  # [M, N]

    return core, graph_ms(_each([partial(dequant, xs[q.shape[1]], q, s) for q, s in q8]))


def _int4(xs: dict[int, torch.Tensor]) -> float:
    q4 = [(torch.ops.aten._convert_weight_to_int4pack(
        torch.randint(0, 255, (n, k // 2), device="cuda", dtype=torch.uint8), 8),
        torch.rand(k // 128, n, 2, device="cuda", dtype=torch.bfloat16), k) for n, k in SHAPES]
    return graph_ms(_each([partial(torch.ops.aten._weight_int4pack_mm, xs[k], p, 128, sz)
                           for p, sz, k in q4]))


def probe(m: int) -> dict[str, float]:
    """Each variant's ms at ``m`` rows (weights freed between variants)."""
    xs = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in (4096, 11008)}
    out = {"bf16": _bf16(xs)}
    out["int8pack_core"], out["int8_dequant_then_matmul"] = _int8(xs)
    out["int4pack_core"] = _int4(xs)
    torch.cuda.empty_cache()
    return out


def main() -> int:
    if not torch.cuda.is_available():
        raise SystemExit("probe_quant_kernels needs a CUDA GPU")
    name = torch.cuda.get_device_name()
    result = {"command": "python -m benchmarks.probe_quant_kernels", "device": name,
              "torch": torch.__version__, "ms": {f"M{m}": probe(m) for m in (1, 8)}}
    out = Path(os.environ.get("OUT", ".")) / f"quant_kernels_{name.split()[1].lower()}.json"
    write_result(out, result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
