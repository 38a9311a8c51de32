"""int4 matmuls by row count: core's tinygemm against widen-then-GEMM (GPU only).

Why: :data:`eventspec.shared.node.static.int4_dense.INT4_DENSE_MIN_ROWS` is the row
count from which the drafter's CUDA int4 matmul widens the weight and runs the dense
GEMM. This measures both orders, and bf16, on one decoder layer of the 7B drafter (its
four projections, random weights, group 128) at M = 1 to 1024 rows, a device sync
around each repeat, and reports the crossover: the smallest M from which widening is
faster at every larger M measured.

    python -m benchmarks.probe_int4_dense      # writes int4-dense-<device>.json to $OUT
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from benchmarks.device_timing import median_ms
from benchmarks.stamp import write_result
from eventspec.shared.node.static.int4_dense import INT4_DENSE_MIN_ROWS, dequantize_int4
from eventspec.shared.node.static.quant import quantize_int4

#: [N, K] of one 7B decoder layer's projections: QKV, O, gate-up, down.
LAYER_SHAPES = [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008)]
ROWS = [1, 8, 16, 32, 48, 64, 96, 128, 192, 256, 512, 737, 1024]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_int4_dense needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(0)
    layer = []
    for n, k in LAYER_SHAPES:
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()  # [N, K]
        layer.append((w, quantize_int4(w)))
    rows_out = []
    for m in ROWS:
        xs = [torch.randn(m, k, device="cuda", generator=g).bfloat16() for _, k in LAYER_SHAPES]

        def tinygemm(xs: list[torch.Tensor] = xs) -> None:
            for x, (_, q) in zip(xs, layer, strict=True):
                torch.ops.aten._weight_int4pack_mm(x, q.packed, q.group_size, q.scales_and_zeros)

        def widened(xs: list[torch.Tensor] = xs) -> None:
            for x, (_, q) in zip(xs, layer, strict=True):
                _ = x @ dequantize_int4(q).t()

        def dense(xs: list[torch.Tensor] = xs) -> None:
            for x, (w, _) in zip(xs, layer, strict=True):
                _ = x @ w.t()

        row = {
            "rows": m,
            "tinygemm_ms": median_ms(tinygemm, args.repeats),
            "widen_gemm_ms": median_ms(widened, args.repeats),
            "bf16_ms": median_ms(dense, args.repeats),
        }
        print(row, flush=True)
        rows_out.append(row)
    crossover = None
    for i, row in enumerate(rows_out):
        if all(r["widen_gemm_ms"] < r["tinygemm_ms"] for r in rows_out[i:]):
            crossover = row["rows"]
            break
    widen_alone = median_ms(lambda: [dequantize_int4(q) for _, q in layer], args.repeats)
    name = torch.cuda.get_device_name().replace("NVIDIA ", "").lower().replace(" ", "-")
    out = write_result(Path(args.out) / f"int4-dense-{name}.json", {
        "command": "python -m benchmarks.probe_int4_dense",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "layer_shapes": LAYER_SHAPES,
        "group_size": 128,
        "repeats": args.repeats,
        "rows": rows_out,
        "widen_one_layer_ms": widen_alone,
        "crossover_rows": crossover,
        "int4_dense_min_rows": INT4_DENSE_MIN_ROWS,
    })
    print(f"crossover at {crossover} rows (INT4_DENSE_MIN_ROWS = {INT4_DENSE_MIN_ROWS}); {out}")


if __name__ == "__main__":
    main()
