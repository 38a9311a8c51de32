"""Issue 39 item 3's two candidates for ``--batch-invariant`` at <= 1.2x, probed (GPU only).

1. **GEMM**: the persistent TMA-fed kernel (``shared/node/static/invariant_tma.py``)
   against the pointer-fed tiles of the table and cuBLAS, per 7B weight shape at
   M in {1, 16, 64, 144, 576, 2100}: does a row keep the table's bits (a 2,100-row call
   and a 1-row call, bitwise), and how long does each take (``triton.testing.do_bench``
   medians, L2 flushed)?
2. **Attention**: does a prompt row get a decode row's bits in each layout: 16-query
   tiles (mma) at splits of 128 and 256 keys, the prompt's grouped four to a program
   (``shared/node/static/invariant_prompt.py``), and 64-query tiles (wgmma)? Decode
   (1 query) and verify (9 queries) rows at several positions against the prompt's,
   bitwise; and each layout's time for a 2,100-token prompt and for decode
   steps of B = 1, 16, 64 sessions of Q = 1, 9 queries over 2,100 positions.

    python -m benchmarks.probe_invariant_persistent --out "$OUT"
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.bench_invariant_kernels import (
    HEAD_DIM,
    HEADS,
    ROWS,
    SHAPES,
    SLOT_POSITIONS,
    bench_ms,
    config_name,
    decoder_ms,
    gemm_inputs,
)
from benchmarks.stamp import write_result
from eventspec.shared.node.static.invariant_tiles import MmConfig, mm_config, prefill_tiles

#: Tiles tried persistent besides the table's own (BM, BN, BK, warps, stages).
PERSISTENT_TILES = ((64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4),
                    (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
                    (128, 128, 64, 4, 4), (256, 64, 64, 8, 3), (64, 256, 64, 4, 3),
                    (128, 64, 64, 8, 3), (256, 64, 64, 8, 4))
#: (query tile, split, four pseudo-sessions per program) layouts of the attention: the
#: step's 16-query tiles (grouped for prompts, :mod:`.invariant_prompt`, or not) and
#: 64-query ones (wgmma: other bits).
LAYOUTS = ((16, 128, False), (16, 256, False), (16, 256, True), (64, 256, False))
PROMPT = 2100
#: Positions whose decode / verify rows are compared with the prompt's.
PROBE_POSITIONS = (0, 1, 63, 64, 200, 1000, 2000, PROMPT - 9)


def probe_gemms() -> dict[str, Any]:
    """Bits and times of the persistent kernel per shape and M (module docstring)."""
    from eventspec.shared.node.static.invariant_kernels import invariant_mm

    weights, xs = gemm_inputs(0)
    shapes: dict[str, Any] = {}
    fastest: dict[str, dict[int, float]] = {"cublas": {}, "table": {}, "persistent": {}}
    per_shape_ms: dict[str, dict[str, dict[int, float]]] = {key: {} for key in fastest}
    for name, (n, k) in SHAPES.items():
        w, x = weights[name], xs[k]
        ref = invariant_mm(x[:PROMPT], w)  # the table's pointer-fed tiles
        row: dict[str, Any] = {
            "cublas": {m: bench_ms(lambda m=m, x=x, w=w: F.linear(x[:m], w)) for m in ROWS},
            "table": {m: bench_ms(lambda m=m, x=x, w=w: invariant_mm(x[:m], w)) for m in ROWS},
        }
        tries = {f"table@{m}": dataclasses.replace(mm_config(n, k, m), persistent=True)
                 for m in (1, 144, PROMPT)}
        tries.update({config_name(MmConfig(*t)): MmConfig(*t, persistent=True)
                      for t in PERSISTENT_TILES})
        per: dict[str, Any] = {}
        for cname, c in tries.items():
            try:
                got = invariant_mm(x[:PROMPT], w, config=c)
                one = invariant_mm(x[:1].clone(), w, config=c)
                acc = x.new_zeros((PROMPT, n))
                invariant_mm(x[:PROMPT], w, accumulate_into=acc, config=c)
                equal = bool(torch.equal(got, ref) and torch.equal(one, ref[:1])
                             and torch.equal(acc, ref))
                ms = {m: bench_ms(lambda m=m, c=c, x=x, w=w: invariant_mm(x[:m], w, config=c))
                      for m in ROWS}  # fmt: skip
            except Exception as exc:  # a tile Triton refuses (shared memory, registers)
                per[cname] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                print(name, cname, per[cname]["error"], flush=True)
                continue
            diff = float((got.float() - ref.float()).abs().max())
            per[cname] = {"equal_to_table": equal, "max_abs_diff": diff, "ms": ms}
            print(f"{name} {cname} equal={equal} " + " ".join(
                f"{m}:{v:.4f}/{row['table'][m]:.4f}/{row['cublas'][m]:.4f}"
                for m, v in ms.items()), flush=True)
        row["persistent"] = per
        shapes[name] = row
        per_shape_ms["cublas"][name] = row["cublas"]
        per_shape_ms["table"][name] = row["table"]
        per_shape_ms["persistent"][name] = {
            m: min([v["ms"][m] for v in per.values() if v.get("equal_to_table")],
                   default=float("nan")) for m in ROWS}
    decoder = {str(m): {key: decoder_ms(per_shape_ms[key], m) for key in per_shape_ms}
               for m in ROWS}
    return {"shapes": shapes, "decoder_ms_best_equal": decoder}


def probe_attention() -> dict[str, Any]:
    """Prompt rows against decode and verify rows, and times, per layout."""
    from eventspec.shared.node.static.invariant_kernels import (
        fixed_split_attention,
        prefill_fixed_split_attention,
    )

    dev = torch.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(3)
    shape = (64, HEADS, SLOT_POSITIONS, HEAD_DIM)  # [S, Hkv, T, D]: 64 sessions' slots
    kc = torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    vc = torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    q = torch.randn(PROMPT, HEADS, HEAD_DIM, device="cuda", generator=gen).bfloat16()

    def ids(*values: int) -> torch.Tensor:
        return torch.tensor(values, device=dev)

    out: dict[str, Any] = {"flash_sdpa_ms": bench_ms(
        lambda: F.scaled_dot_product_attention(q.transpose(0, 1)[None], kc[0:1, :, :PROMPT],
                                               vc[0:1, :, :PROMPT], is_causal=True))}
    for tile, split, grouped in LAYOUTS:
        tiles = prefill_tiles([0], [0], [PROMPT], dev, tile)
        if not grouped:
            tiles = dataclasses.replace(tiles, groups=None)
        prompt = prefill_fixed_split_attention(q, kc, vc, tiles, split=split)  # [L, H, D]
        equal = True
        for p in PROBE_POSITIONS:
            one = fixed_split_attention(q[p].view(1, 1, HEADS, HEAD_DIM), kc, vc, ids(0),
                                        ids(p), ids(p + 1), split=split, query_tile=tile)
            nine = fixed_split_attention(q[p:p + 9].reshape(1, 9, HEADS, HEAD_DIM), kc, vc,
                                         ids(0), ids(p), ids(p + 9), split=split,
                                         query_tile=tile)
            equal = equal and torch.equal(one[0, 0], prompt[p])
            equal = equal and torch.equal(nine[0], prompt[p:p + 9])
        key = f"tile{tile}_split{split}" + ("_grouped" if grouped else "")
        row: dict[str, Any] = {"decode_rows_equal_prompt_rows": bool(equal), "prompt_ms": bench_ms(
            functools.partial(prefill_fixed_split_attention, q, kc, vc, tiles, split=split))}
        for b in (1, 16, 64):
            for nq in (1, 9):
                qb = torch.randn(b, nq, HEADS, HEAD_DIM, device="cuda", generator=gen).bfloat16()
                slots, starts = torch.arange(b, device=dev), torch.full((b,), PROMPT, device=dev)
                row[f"B{b}_Q{nq}_ms"] = bench_ms(functools.partial(
                    fixed_split_attention, qb, kc, vc, slots, starts, starts + nq, split=split,
                    query_tile=tile))
        out[key] = row
        print(key, row, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip-gemm", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_invariant_persistent needs CUDA")
    import triton

    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "triton": triton.__version__}
    result["attention"] = probe_attention()
    if not args.skip_gemm:
        result["gemm"] = probe_gemms()
        print(json.dumps(result["gemm"]["decoder_ms_best_equal"], indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_result(Path(args.out, "invariant-persistent-probe.json"), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
