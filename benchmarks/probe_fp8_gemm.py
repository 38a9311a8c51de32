"""Where an fp8 prefill's time goes, per GEMM of the 7B decoder at a prompt's rows
(issue 39 item 2): bf16 ``mm`` against ``torch._scaled_mm`` with per-row and with
per-tensor scales, and the activations' quantisation (torch ops against the one-pass
Triton kernel). Medians of ``--repeats`` CUDA-event timings; 32 layers' worth summed.

    python -m benchmarks.probe_fp8_gemm --out $OUT     # on the GPU machine
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch

from benchmarks.device_timing import median_ms
from benchmarks.stamp import write_result
from eventspec.shared.node.static.fp8 import (
    FP8_MAX,
    quantize_fp8,
    quantize_rows,
    quantize_rows_torch,
)

#: (name, N, K) of one 7B layer's GEMMs.
SHAPES = (("qkv", 12288, 4096), ("o", 4096, 4096), ("gate_up", 22016, 4096),
          ("down", 4096, 11008))


def measure(m: int, name: str, n: int, k: int, repeats: int) -> dict[str, Any]:
    """One GEMM of M rows x [N, K] weights, each way (the module docstring)."""
    x = torch.randn(m, k, device="cuda").bfloat16()  # [M, K]
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()  # [N, K]
    wq = quantize_fp8(w)
    xq, xs = quantize_rows(x)
    one = torch.ones((), device="cuda")
    return {
        "M": m, "gemm": name, "N": n, "K": k,
        "bf16_ms": median_ms(lambda: x @ w.t(), repeats),
        "fp8_rowwise_ms": median_ms(lambda: torch._scaled_mm(
            xq, wq.q.t(), scale_a=xs, scale_b=wq.scales[None], out_dtype=torch.bfloat16),
            repeats),
        "fp8_tensorwise_ms": median_ms(lambda: torch._scaled_mm(
            xq, wq.q.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), repeats),
        "quant_torch_ms": median_ms(lambda: quantize_rows_torch(x), repeats),
        "quant_triton_ms": median_ms(lambda: quantize_rows(x), repeats),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[512, 2103])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for m in args.rows:
        for name, n, k in SHAPES:
            row = measure(m, name, n, k, args.repeats)
            print({k2: round(v, 4) if isinstance(v, float) else v for k2, v in row.items()},
                  flush=True)
            rows.append(row)
    totals = {}
    for m in args.rows:
        sel = [r for r in rows if r["M"] == m]
        totals[str(m)] = {key: 32 * sum(r[key] for r in sel) for key in
                          ("bf16_ms", "fp8_rowwise_ms", "fp8_tensorwise_ms",
                           "quant_torch_ms", "quant_triton_ms")}
    print(totals)
    result = {"device": torch.cuda.get_device_name(), "fp8_max": FP8_MAX, "rows": rows,
              "per_prefill_32_layers": totals}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_result(Path(args.out, "fp8-gemm-probe.json"), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
