"""The batch-invariant Triton kernels against cuBLAS and the split-KV kernel (GPU only).

Why: ``--batch-invariant`` takes its GEMM tiles from a table
(``shared/node/static/invariant_tiles.py``, ``MM_CONFIGS``: per weight shape, a tile
for each bucket of M); this measures candidates so the table is chosen by numbers, and
``--cross-tiles`` checks that different tiles give a row the same bits. For each
7B weight shape and M in {1, 16, 64, 144, 576, 2100} it times ``invariant_mm`` under
each candidate config (the table's own, and a few uniform ones, or ``--config``) and
``torch.nn.functional.linear`` (cuBLAS), all by ``triton.testing.do_bench`` medians with
the L2 flushed between runs; reports the 7B decoder's GEMM time (32 layers of QKV, wo,
gate-up and down plus the LM head) at each M per config, and per shape the ratio to
cuBLAS at M = 144 (a 16-session verify step of 8 drafts) and 2,100 (a prompt); and checks
each config's row invariance (a row's bits in calls of 1, 144 and 2,100 rows).
Then it times ``fixed_split_attention`` (split sizes 64/128/256) against
``splitkv_attention`` at B = 1, 16, 64 and Q = 1, 9 over 2,100 cached positions, 32
heads of 128, and the prefill's pseudo-session attention over a 2,100-token prompt
against causal SDPA (flash). Meant to finish in about 2 minutes on an H100.

    python -m benchmarks.bench_invariant_kernels --out "$OUT"   # JSON + a printed table
    python -m benchmarks.bench_invariant_kernels --config 64,64,64,4,4 --config 128,128,64,8,3
    python -m benchmarks.bench_invariant_kernels --cross-tiles --out "$OUT"   # bits across tiles
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.stamp import write_result
from eventspec.shared.node.static.invariant_tiles import MmConfig, mm_config

#: name -> (N, K) of the 7B decoder's weights; per layer: qkv, wo, gate_up, down.
SHAPES: dict[str, tuple[int, int]] = {
    "qkv": (12288, 4096), "wo": (4096, 4096), "gate_up": (22016, 4096),
    "down": (4096, 11008), "lm_head": (32064, 4096),
}
LAYER_SHAPES = ("qkv", "wo", "gate_up", "down")
LAYERS = 32
ROWS = (1, 16, 64, 144, 576, 2100)
#: The two M the issue's targets are about: a B = 16, k = 8 verify step, and a prompt.
STEP_M, PREFILL_M = 144, 2100
#: Uniform candidates (every shape the same tile) besides the table's own.
CANDIDATES: dict[str, MmConfig] = {
    "64x64x64w4s4": MmConfig(64, 64, 64, 4, 4),
    "64x32x128w4s4": MmConfig(64, 32, 128, 4, 4),
    "64x128x64w4s3": MmConfig(64, 128, 64, 4, 3),
    "128x128x64w8s3": MmConfig(128, 128, 64, 8, 3),
    "16x64x128w4s4": MmConfig(16, 64, 128, 4, 4),
}
TABLE = "table"
ATTN_BATCHES = (1, 16, 64)
ATTN_QUERIES = (1, 9)
ATTN_SPLITS = (64, 128, 256)
CONTEXT = 2100
SLOT_POSITIONS = 2560  # positions per KV slot (the slot size T: sets the combine's width)
HEADS, HEAD_DIM = 32, 128


def parse_config(text: str) -> MmConfig:
    """``BM,BN,BK,warps,stages[,group_m]`` -> MmConfig."""
    parts = [int(p) for p in text.split(",")]
    if len(parts) not in (5, 6):
        raise argparse.ArgumentTypeError(f"a config is BM,BN,BK,warps,stages[,group]: {text}")
    return MmConfig(*parts)


def config_name(c: MmConfig) -> str:
    return f"{c.block_m}x{c.block_n}x{c.block_k}w{c.num_warps}s{c.num_stages}g{c.group_m}"


def bench_ms(fn: Callable[[], object]) -> float:
    """Median ms of ``fn`` (Triton's do_bench: CUDA events, L2 flushed before each run)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def decoder_ms(per_shape: dict[str, dict[int, float]], m: int) -> float:
    """The 7B decoder's GEMM time at M rows: 32 layers' four projections + the LM head."""
    return LAYERS * sum(per_shape[s][m] for s in LAYER_SHAPES) + per_shape["lm_head"][m]


def gemm_inputs(seed: int) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """Random bf16 weights of each 7B shape and activations of the most rows, by K (this
    benchmark's and ``probe_invariant_persistent``'s inputs)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    weights = {name: (torch.randn(n, k, device="cuda", generator=gen) * 0.02).bfloat16()
               for name, (n, k) in SHAPES.items()}  # fmt: skip
    xs = {k: torch.randn(max(ROWS), k, device="cuda", generator=gen).bfloat16()
          for k in {k for _, k in SHAPES.values()}}  # fmt: skip
    return weights, xs


def row_invariant(config: MmConfig | None, x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether rows of a 2,100-row call equal the same rows from 1- and 144-row calls."""
    from eventspec.shared.node.static.invariant_kernels import invariant_mm

    full = invariant_mm(x[:PREFILL_M], w, config=config)  # [2100, N]
    part = invariant_mm(x[:STEP_M], w, config=config)  # [144, N]
    ok = torch.equal(full[:STEP_M], part)
    for r in (0, 77, STEP_M - 1, PREFILL_M - 1):
        alone = invariant_mm(x[r : r + 1].clone(), w, config=config)  # [1, N]
        ok = ok and torch.equal(alone, full[r : r + 1])
    return bool(ok)


def bench_gemms(candidates: dict[str, MmConfig]) -> dict[str, Any]:
    """cuBLAS and every candidate on every shape and M; see the module docstring."""
    from eventspec.shared.node.static.invariant_kernels import invariant_mm

    weights, xs = gemm_inputs(0)
    ms: dict[str, dict[str, dict[int, float]]] = {"cublas": {}}
    invariant: dict[str, dict[str, bool]] = {}
    errors: dict[str, str] = {}
    for name, (_, k) in SHAPES.items():
        w, x = weights[name], xs[k]
        ms["cublas"][name] = {m: bench_ms(lambda m=m, x=x, w=w: F.linear(x[:m], w))
                              for m in ROWS}  # fmt: skip
    for cname in [TABLE, *candidates]:
        ms[cname], invariant[cname] = {}, {}
        try:
            for name, (_, k) in SHAPES.items():
                # The table's tile follows M (config None: the engine's own choice).
                c = None if cname == TABLE else candidates[cname]
                w, x = weights[name], xs[k]
                invariant[cname][name] = row_invariant(c, x, w)
                ms[cname][name] = {
                    m: bench_ms(lambda m=m, c=c, x=x, w=w: invariant_mm(x[:m], w, config=c))
                    for m in ROWS
                }  # fmt: skip
        except Exception as exc:  # a config Triton cannot build (shared memory, ...)
            errors[cname] = f"{type(exc).__name__}: {exc}"[:300]
            ms.pop(cname)
            invariant.pop(cname)
    decoder = {c: {m: decoder_ms(per, m) for m in ROWS} for c, per in ms.items()}
    ratios = {
        c: {s: {m: per[s][m] / ms["cublas"][s][m] for m in (STEP_M, PREFILL_M)}
            for s in SHAPES}
        for c, per in ms.items() if c != "cublas"
    }  # fmt: skip
    # Per shape, the candidate with the smallest worse-of-the-two ratio (step, prompt).
    best = {s: min(ratios, key=lambda c, s=s: max(ratios[c][s].values())) for s in SHAPES}
    configs: dict[str, Any] = {c: config_name(v) for c, v in candidates.items()}
    configs[TABLE] = {s: {m: config_name(mm_config(*SHAPES[s], m)) for m in ROWS}
                      for s in SHAPES}  # fmt: skip
    return {"rows": list(ROWS), "configs": configs, "ms": ms, "decoder_ms": decoder,
            "ratio_to_cublas": ratios, "row_invariant": invariant,
            "best_per_shape": best if ratios else {}, "errors": errors}


#: Tile shapes (BLOCK_M, BLOCK_N, warps, stages) tried against the table's own tile at
#: the table's BLOCK_K and at the other BLOCK_K (``--cross-tiles``): all wgmma shapes
#: (BLOCK_M >= 64, warps a multiple of 4), so only the tiling differs, not the MMA.
CROSS_TILES = ((64, 32, 4, 4), (64, 64, 4, 4), (64, 128, 4, 4), (64, 256, 4, 3),
               (128, 32, 4, 4), (128, 64, 4, 4), (128, 64, 8, 3), (128, 128, 8, 3),
               (128, 256, 8, 3), (256, 64, 8, 3), (256, 128, 8, 3))
#: The few also tried at the other BLOCK_K (does the K chunk change a row's bits?).
CROSS_OTHER_K = ((64, 64, 4, 4), (128, 128, 8, 3), (256, 128, 8, 3))
#: Query tiles and splits tried for the prefill's attention (``--cross-tiles``).
CROSS_QUERY_TILES = (16, 64, 128)
CROSS_SPLITS = (128, 256)


def cross_tile_gemms() -> dict[str, Any]:
    """Whether a row's bits depend on the GEMM's tile shape when K is walked in the same
    order: each shape's [2,100, N] product under every :data:`CROSS_TILES` shape (at the
    table's BLOCK_K, a few at the other) against the table's tile, bitwise; and the times.
    If they are equal, the engine may choose the tile by M (fast at every M) and stay
    batch-invariant; the summary gives the fastest bit-equal tile per shape and M."""
    from eventspec.shared.node.static.invariant_kernels import invariant_mm

    weights, xs = gemm_inputs(0)
    out: dict[str, Any] = {}
    best: dict[str, dict[int, tuple[str, float]]] = {}
    for name, (n, k) in SHAPES.items():
        w, x = weights[name], xs[k]
        ref_cfg = mm_config(n, k)
        ref = invariant_mm(x[:PREFILL_M], w, config=ref_cfg)  # [2100, N]
        rows: dict[str, Any] = {"cublas": {m: bench_ms(lambda m=m, x=x, w=w: F.linear(x[:m], w))
                                           for m in ROWS}}  # fmt: skip
        per: dict[str, Any] = {}
        other_k = 128 if ref_cfg.block_k == 64 else 64
        tries = [MmConfig(bm, bn, ref_cfg.block_k, wp, st) for bm, bn, wp, st in CROSS_TILES]
        tries += [MmConfig(bm, bn, other_k, wp, st) for bm, bn, wp, st in CROSS_OTHER_K]
        for c in tries:
            cname = config_name(c)
            try:
                got = invariant_mm(x[:PREFILL_M], w, config=c)
                one = invariant_mm(x[:1].clone(), w, config=c)
                equal = bool(torch.equal(got, ref) and torch.equal(one, ref[:1]))
                diff = float((got.float() - ref.float()).abs().max())
                ms = {m: bench_ms(lambda m=m, c=c, x=x, w=w: invariant_mm(x[:m], w, config=c))
                      for m in ROWS}  # fmt: skip
            except Exception as exc:  # shared memory, registers: Triton refuses
                per[cname] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                continue
            per[cname] = {"equal_to_table": equal, "max_abs_diff": diff, "ms": ms}
            print(f"{name} {cname} equal={equal} " + " ".join(
                f"{m}:{v:.4f}/{rows['cublas'][m]:.4f}" for m, v in ms.items()), flush=True)
        rows["configs"] = per
        rows["table"] = config_name(ref_cfg)
        out[name] = rows
        best[name] = {}
        for m in ROWS:
            ok = {c: v["ms"][m] for c, v in per.items() if v.get("equal_to_table")}
            if ok:
                c = min(ok, key=ok.__getitem__)
                best[name][m] = (c, ok[c] / rows["cublas"][m])
    totals = {}
    for m in ROWS:
        if all(m in best[s] for s in SHAPES):
            fast = {s: out[s]["configs"][best[s][m][0]]["ms"][m] for s in SHAPES}
            totals[m] = {"best_equal": decoder_ms({s: {m: v} for s, v in fast.items()}, m),
                         "cublas": decoder_ms({s: out[s]["cublas"] for s in SHAPES}, m)}
    return {"shapes": out, "best_equal_per_m": best, "decoder_ms": totals}


def cross_tile_attention() -> dict[str, Any]:
    """Whether a prompt row's attention bits depend on the query tile (16 rows: mma;
    64/128 rows: wgmma) at a fixed split, and what each tile and split costs for a
    2,100-token prompt; rows compared bitwise against the 16-row tile at split 128."""
    from eventspec.shared.node.static.invariant_kernels import prefill_fixed_split_attention
    from eventspec.shared.node.static.invariant_tiles import prefill_tiles

    gen = torch.Generator(device="cuda").manual_seed(2)
    shape = (2, HEADS, SLOT_POSITIONS, HEAD_DIM)
    kc = torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    vc = torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    q = torch.randn(CONTEXT, HEADS, HEAD_DIM, device="cuda", generator=gen).bfloat16()
    dev = torch.device("cuda")
    results: dict[str, Any] = {"flash_sdpa_ms": bench_ms(
        lambda: F.scaled_dot_product_attention(q.transpose(0, 1)[None], kc[0:1, :, :CONTEXT],
                                               vc[0:1, :, :CONTEXT], is_causal=True))}
    refs = {}
    for split in CROSS_SPLITS:
        for tile in CROSS_QUERY_TILES:
            key = f"tile{tile}_split{split}"
            try:
                tiles = prefill_tiles([0], [0], [CONTEXT], dev, tile)
                got = prefill_fixed_split_attention(q, kc, vc, tiles, split=split)
                # The same prompt in two chunks (1,000 + 1,100 rows): chunking is free?
                a = prefill_fixed_split_attention(
                    q[:1000], kc, vc, prefill_tiles([0], [0], [1000], dev, tile), split=split)
                b = prefill_fixed_split_attention(
                    q[1000:], kc, vc, prefill_tiles([0], [1000], [CONTEXT - 1000], dev, tile),
                    split=split)
                refs.setdefault(split, got)
                results[key] = {
                    "equal_to_tile16": bool(torch.equal(got, refs[split])),
                    "chunks_equal_whole": bool(torch.equal(torch.cat([a, b]), got)),
                    "ms": bench_ms(lambda tiles=tiles, split=split: prefill_fixed_split_attention(
                        q, kc, vc, tiles, split=split)),
                }
            except Exception as exc:
                results[key] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return results


def bench_attention() -> dict[str, Any]:
    """Fixed-split vs split-KV decode attention, and the prefill's pseudo-sessions vs flash."""
    from eventspec.shared.node.static.attention import num_splits_for, splitkv_attention
    from eventspec.shared.node.static.invariant_kernels import (
        fixed_split_attention,
        prefill_fixed_split_attention,
    )
    from eventspec.shared.node.static.invariant_tiles import prefill_tiles

    sm = torch.cuda.get_device_properties(0).multi_processor_count
    slots = max(ATTN_BATCHES) + 1
    gen = torch.Generator(device="cuda").manual_seed(1)
    shape = (slots, HEADS, SLOT_POSITIONS, HEAD_DIM)
    kc = torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    vc = torch.randn(shape, device="cuda", generator=gen, dtype=torch.bfloat16)
    decode = []
    for b in ATTN_BATCHES:
        for nq in ATTN_QUERIES:
            q = torch.randn(b, nq, HEADS, HEAD_DIM, device="cuda", generator=gen).bfloat16()
            sl = torch.arange(b, device="cuda")
            st = torch.full((b,), CONTEXT, device="cuda")
            lens = st + nq
            splits = num_splits_for(b, HEADS, sm)
            row: dict[str, Any] = {"B": b, "Q": nq, "splitkv_splits": splits}
            row["splitkv_ms"] = bench_ms(
                lambda q=q, sl=sl, st=st, lens=lens, splits=splits: splitkv_attention(
                    q, kc, vc, sl, st, lens, num_splits=splits))
            for split in ATTN_SPLITS:
                row[f"fixed{split}_ms"] = bench_ms(
                    lambda q=q, sl=sl, st=st, lens=lens, split=split: fixed_split_attention(
                        q, kc, vc, sl, st, lens, split=split))
            decode.append(row)
    q = torch.randn(CONTEXT, HEADS, HEAD_DIM, device="cuda", generator=gen).bfloat16()
    tiles = prefill_tiles([0], [0], [CONTEXT], torch.device("cuda"))
    k, v = kc[0:1, :, :CONTEXT], vc[0:1, :, :CONTEXT]  # [1, H, L, D]
    prefill: dict[str, Any] = {"L": CONTEXT, "flash_sdpa_ms": bench_ms(
        lambda: F.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, is_causal=True))}
    for split in ATTN_SPLITS:
        prefill[f"fixed{split}_ms"] = bench_ms(
            lambda split=split: prefill_fixed_split_attention(q, kc, vc, tiles, split=split))
    return {"context": CONTEXT, "slot_positions": SLOT_POSITIONS, "heads": HEADS,
            "head_dim": HEAD_DIM, "decode": decode, "prefill": prefill}


def format_tables(result: dict[str, Any]) -> str:
    """The compact printed summary of :func:`bench_gemms` and :func:`bench_attention`."""
    lines: list[str] = []
    g = result["gemm"]
    rows = g["rows"]
    lines.append("7B decoder GEMMs (32 layers + LM head), ms by M; inv = row-invariant")
    lines.append(f"{'config':<30}" + "".join(f"{m:>9}" for m in rows) + "   inv")
    for c, per_m in g["decoder_ms"].items():
        inv = g["row_invariant"].get(c)
        mark = "-" if inv is None else ("yes" if all(inv.values()) else "NO")
        lines.append(f"{c[:30]:<30}" + "".join(f"{per_m[m]:>9.3f}" for m in rows) + f"   {mark}")
    lines.append("")
    lines.append(f"ratio to cuBLAS per shape at M={STEP_M} / M={PREFILL_M}")
    shapes = list(SHAPES)
    lines.append(f"{'config':<16}" + "".join(f"{s:>16}" for s in shapes))
    for c, per_s in g["ratio_to_cublas"].items():
        lines.append(f"{c[:16]:<16}" + "".join(
            f"{per_s[s][STEP_M]:>8.2f}/{per_s[s][PREFILL_M]:<7.2f}" for s in shapes))
    lines.append("best per shape (smallest worse ratio): " + ", ".join(
        f"{s}={c}" for s, c in g["best_per_shape"].items()))
    for c, err in g["errors"].items():
        lines.append(f"config {c} failed: {err}")
    a = result.get("attention")
    if a:
        lines.append("")
        lines.append(f"decode attention over {a['context']} positions, ms "
                     f"(slot of {a['slot_positions']})")
        keys = ["splitkv_ms", *[f"fixed{s}_ms" for s in ATTN_SPLITS]]
        lines.append(f"{'B':>4}{'Q':>4}" + "".join(f"{k:>14}" for k in keys))
        for row in a["decode"]:
            cells = "".join(f"{row[k]:>14.4f}" for k in keys)
            lines.append(f"{row['B']:>4}{row['Q']:>4}{cells}")
        p = a["prefill"]
        fixed = ", ".join(f"fixed{s} {p[f'fixed{s}_ms']:.3f} ms" for s in ATTN_SPLITS)
        lines.append(f"prefill attention, {p['L']} tokens: flash SDPA "
                     f"{p['flash_sdpa_ms']:.3f} ms; {fixed}")
    return "\n".join(lines)


def readme_rows(result: dict[str, Any]) -> list[str]:
    """The README's rows: the 7B decoder's GEMMs per M with cuBLAS and with the shipped
    tile table (``tests/unit/test_readme.py`` checks them against the committed JSON)."""
    totals = result["gemm"]["decoder_ms"]
    rows = []
    for m in result["gemm"]["rows"]:
        base, inv = totals["cublas"][str(m)], totals["table"][str(m)]
        rows.append(f"| {m} | {base:.2f} | {inv:.2f} | {inv / base:.2f} |")
    return rows


def _out_path(arg: str | None, device: str) -> Path:
    name = f"invariant_kernels_{device.replace(' ', '_')}.json"
    if arg and arg.endswith(".json"):
        return Path(arg)
    base = arg or os.environ.get("OUT") or "benchmarks/results"
    return Path(base) / name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None,
                    help="a .json path or a folder (default: $OUT, else benchmarks/results)")
    ap.add_argument("--config", action="append", type=parse_config, default=None,
                    help="a candidate tile BM,BN,BK,warps,stages[,group] for every shape "
                         "(repeatable; replaces the built-in uniform candidates)")
    ap.add_argument("--skip-attention", action="store_true")
    ap.add_argument("--cross-tiles", action="store_true",
                    help="only test whether rows keep their bits across tile shapes "
                         "(GEMM tiles, attention query tiles) and time each")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_invariant_kernels needs CUDA")
        return 2
    candidates = ({config_name(c): c for c in args.config} if args.config
                  else dict(CANDIDATES))  # fmt: skip
    device = torch.cuda.get_device_name(0)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"device": device, "torch": torch.__version__}
    import triton

    result["triton"] = triton.__version__
    if args.cross_tiles:
        result["cross_attention"] = cross_tile_attention()
        print(json.dumps(result["cross_attention"], indent=1))
        result["cross_gemm"] = cross_tile_gemms()
        result["seconds"] = time.perf_counter() - t0
        path = _out_path(args.out, device).with_name(
            f"invariant_cross_tiles_{device.replace(' ', '_')}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_result(path, result)
        print(json.dumps({"best_equal_per_m": result["cross_gemm"]["best_equal_per_m"],
                          "decoder_ms": result["cross_gemm"]["decoder_ms"]}, indent=1))
        for s, v in result["cross_gemm"]["shapes"].items():
            print(s, {c: r.get("equal_to_table", r.get("error")) for c, r in v["configs"].items()})
        return 0
    result["gemm"] = bench_gemms(candidates)
    if not args.skip_attention:
        result["attention"] = bench_attention()
    result["seconds"] = time.perf_counter() - t0
    path = _out_path(args.out, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_result(path, result)
    print(format_tables(result))
    print(f"{result['seconds']:.0f} s; wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
