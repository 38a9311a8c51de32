"""Markdown tables of committed benchmark results: the cloud's runs, and the helpers.

``tools/render_results.py`` calls these to fill the ``<!-- results: ... -->`` blocks of
``docs/results/*.md``. They live here, apart from the benchmarks that write the JSON,
so that rendering the docs needs neither torch nor the benchmarks' imports (issue 37:
tests do not import ``benchmarks/``), and so that a table in the docs is never typed by
hand: change a format here, re-render, and every page follows.

Each function takes ``[(label, result), ...]`` (the label is what the marker gave after
``=``, else the file's stem) and returns the table's lines. This module holds the engine,
capacity and load runs; ``results_tables_system.py`` the whole-system ones (end to end,
the edge, the toy world, faults, GPU tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Named = Sequence[tuple[str, dict[str, Any]]]


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A Markdown table: the header, the rule, one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def dash(value: float | None, fmt: str) -> str:
    """``value`` formatted, or an en dash where the run has none."""
    return "–" if value is None else format(value, fmt)


def mode(name: str) -> str:
    """A capacity run's mode as the tables spell it."""
    return "target-only" if name == "target_only" else "oracle edge"


def engine_steps(runs: Named) -> list[str]:
    """The static engine's step per (B, k) against its bandwidth floor."""
    (_, r), = runs
    replay = r.get("replay_only_ms", {})
    rows = [(s["B"], s["k"], f"{s['ms']:.2f}",
             dash(replay.get("B{}_q{}".format(s["B"], s["k"] + 1)), ".2f"),
             f"{s['floor_ms']:.2f}", f"{s['ratio']:.2f}") for s in r["steps"]]
    return table(["B", "k", "step ms", "graph replay alone ms", "floor ms", "step / floor"],
                  rows)


def engine_run(runs: Named) -> list[str]:
    """The rest of an engine run: prefill, the HF reference, warm-up, memory, agreement."""
    (_, r), = runs
    a, w, hf = r["agreement"], r["warm_up"], r["hf_eager"]
    rows = [
        (f"prefill, 8 frames + prompt ({int(r['prompt_tokens']):,} tokens), tower included",
         f"{r['prefill_ms']:.1f} ms (tower alone {r['tower_ms']:.1f} ms)"),
        ("HF eager step at B = 1, DynamicCache, same GPU",
         f"{hf['hf_step_k0_ms']:.1f} ms (k = 0), {hf['hf_step_k8_ms']:.1f} ms (k = 8)"),
        (f"warm-up: {int(w['graphs'])} graphs captured",
         f"{w['seconds']:.1f} s, {w['graph_bytes_allocated'] / 2**30:.1f} GiB of graph memory"),
        ("peak GPU memory (weights, KV, graphs, HF reference runs)",
         f"{r['peak_gpu_mem_GiB']:.1f} GiB"),
        (f"greedy agreement with HF eager, same inputs, {int(a['tokens'])} teacher-forced "
         "positions", f"{a['agree_hf_single']:.1%}"),
        ("HF eager against itself (incremental DynamicCache vs one full forward)",
         f"{a['agree_hf_incremental_vs_hf_full']:.1%}"),
        ("the engine's 1-token steps against its 9-token steps, same positions",
         f"{a['agree_single_vs_chunk9']:.0%}"),
        ("logits ‖engine − HF‖ / ‖HF‖", f"{a['logits_rel_err_vs_hf']:.3f}"),
    ]
    return table(["measured", "value"], rows)


def engine_attention(runs: Named) -> list[str]:
    """One layer's attention at the prompt's context, per B × q and implementation, ms."""
    (_, r), = runs
    rows = [(f"{a['B']} × {a['q']}", f"{a['splitkv_ms']:.3f}", f"{a['dense_sdpa_ms']:.3f}",
             f"{a['flex_ms']:.3f}", f"{a['flex_block_mask_ms']:.1f}")
            for a in r["attention_per_layer"]]
    return table(["B × q", "split-KV (Triton)", "dense masked SDPA over whole slots",
                   "FlexAttention + BlockMask", "building the BlockMask"], rows)


def invariant_gemm(runs: Named) -> list[str]:
    """The 7B decoder's GEMMs per M: cuBLAS against one batch-invariant tile per shape."""
    (_, r), = runs
    totals = r["gemm"]["decoder_ms"]
    rows = []
    for m in r["gemm"]["rows"]:
        base, inv = totals["cublas"][str(m)], totals["table"][str(m)]
        rows.append((m, f"{base:.2f}", f"{inv:.2f}", f"{inv / base:.2f}"))
    return table(["M (rows: sessions × tokens)", "cuBLAS ms", "batch-invariant ms", "ratio"],
                  rows)


def invariant_cost(runs: Named) -> list[str]:
    """Whole steps and the prefill, default engine against ``--batch-invariant``."""
    (_, r), = runs
    c = r["comparison"]
    rows: list[tuple[object, ...]] = [
        (s["B"], s["k"], f"{s['default_ms']:.2f}", f"{s['invariant_ms']:.2f}",
         f"{s['ratio']:.2f}") for s in c["steps"]]
    p = c["prefill"]
    rows.append((f"prefill ({int(r['default']['prompt_tokens'])} tokens)", "",
                 f"{p['default_ms']:.1f}", f"{p['invariant_ms']:.1f}", f"{p['ratio']:.2f}"))
    return table(["B", "k", "default ms", "`--batch-invariant` ms", "ratio"], rows)


def _invariance_cell(r: dict[str, Any], prefix: str) -> str:
    keys = [k for k in r if k.startswith(prefix) and k.endswith("_bitwise")]
    if all(r[k] == 1.0 for k in keys):
        return "bitwise equal"
    worst = max(r.get(k.removesuffix("_bitwise") + "_max_abs_diff", 0.0) for k in keys)
    return f"differ by up to {worst:.1e}"


def batch_invariance_cpu(runs: Named) -> list[str]:
    """One session alone against beside others, per mode (CPU, tiny target)."""
    rows = [(label, _invariance_cell(r, "k0_alone_vs_B"), _invariance_cell(r, "k8_alone_vs_B"),
             "bitwise equal" if r["k8_vs_single_steps_bitwise"] == 1.0 else "differ")
            for label, r in runs]
    return table(["mode", "k = 0, alone vs B = 2 / 4", "k = 8, alone vs B = 2 / 4",
                   "9-token step vs 9 single steps"], rows)


def _ratio(r: dict[str, Any], lv: dict[str, Any]) -> float:
    ratios = r["throughput_vs_one_at_a_time"]
    return float(next(v for k, v in ratios.items() if k.startswith(lv["mode"]) and
                      k.endswith(f"@{lv['concurrency']}")))


def _oracle(mode: str) -> str:
    return "target-only" if mode == "target_only" else "oracle edge α 0.8"


def capacity_batches(runs: Named) -> list[str]:
    """Per mode and N: throughput, latency, tokens per step and the batch sizes run."""
    (_, r), = runs
    rows = []
    for lv in r["levels"]:
        hist = ", ".join(f"{k}: {v}" for k, v in lv["batch_size_histogram"].items())
        rows.append((_oracle(lv["mode"]), lv["concurrency"], lv["tokens_per_s"],
                     f"{_ratio(r, lv):.2f}", lv["latency_p50_s"], lv["latency_p99_s"],
                     lv["tokens_per_target_step"], "{" + hist + "}"))
    return table(["mode", "N", "tokens/s", "× one at a time", "p50 s", "p99 s",
                   "tokens / step", "batch sizes run"], rows)


def capacity_server(runs: Named) -> list[str]:
    """Per mode and N through the server, with where a request's time went: TTFT at the
    client and in the server, the prefill and its queue wait, the prefill share."""
    (_, r), = runs
    rows = []
    for lv in r["levels"]:
        rows.append((mode(lv["mode"]), lv["concurrency"], lv["tokens_per_s"],
                     f"{_ratio(r, lv):.2f}", lv["latency_p50_s"], lv["latency_p99_s"],
                     f"{lv['ttft_p50_ms']:.1f} ({lv['server_ttft_p50_ms']:.1f})",
                     f"{lv['prefill_ms_mean']:.1f} + {lv['prefill_wait_ms_mean']:.1f}",
                     lv["ms_per_token_p50"], f"{lv['in_server_step_ms']:.2f}",
                     lv["tokens_per_target_step"], f"{lv['prefill_share_of_wall']:.2f}"))
    return table(["mode", "N", "tokens/s", "× N=1", "p50 s", "p99 s",
                   "TTFT ms, client (server)", "prefill ms + queue wait", "ms/token p50",
                   "in-server step ms", "tokens / step", "prefill share of wall"], rows)


def server_gap(runs: Named) -> list[str]:
    """The in-server step against the engine call's device time, and KV held at once."""
    (_, r), = runs
    rows = [(mode(lv["mode"]), lv["concurrency"], lv["tokens_per_s"], f"{lv['ttft_p50_ms']:.0f}",
             f"{lv['in_server_step_ms']:.2f}", f"{lv['engine_device_ms_per_step']:.2f}",
             f"{lv['in_server_step_ms'] / lv['engine_device_ms_per_step']:.2f}",
             lv["max_sessions_in_a_step"], lv["kv_queue_waits"]) for lv in r["levels"]]
    return table(["mode", "N", "tokens/s", "TTFT p50 ms", "in-server step ms",
                   "device ms (engine call)", "in-server ÷ device",
                   "most sessions in a step", "waited for KV"], rows)


def load(runs: Named) -> list[str]:
    """Open-loop load per server configuration and arrival rate."""
    (_, r), = runs
    rows = []
    for run in r["configs"]:
        for lv in run["levels"]:
            hits = (f"{lv['prefix_hits']} of {lv['requests']}"
                    if lv["prefix_hits"] or lv["prefix_misses"] else "–")
            rows.append((run["config"]["name"], f"{lv['rate_per_s']:g}",
                         f"{lv['ttft_ms_p50']:.0f} / {lv['ttft_ms_p99']:.0f}",
                         f"{lv['itl_ms_p50']:.1f} / {lv['itl_ms_p99']:.1f}",
                         f"{lv['goodput_tok_s']:.1f}", hits))
    return table(["config (`--configs` name)", "rate /s", "TTFT p50 / p99 ms",
                   "ITL p50 / p99 ms", "tokens/s", "prefix hits"], rows)


def load_loop(runs: Named) -> list[str]:
    """Load runs side by side (one per labelled file, e.g. before and after a change to
    the engine loop), with the loop's own time: the in-server step (the loop's host time
    per step) against the engine call's device time, and the ITL ratio."""
    rows = []
    for label, r in runs:
        commit = str(r.get("stamp", {}).get("commit", "?"))[:7]
        for run in r["configs"]:
            for lv in run["levels"]:
                rows.append((label, commit, run["config"]["name"], f"{lv['rate_per_s']:g}",
                             lv["requests"], f"{lv['in_server_step_ms']:.2f}",
                             f"{lv['engine_step_ms']:.2f}",
                             f"{lv['in_server_over_engine']:.2f}",
                             f"{lv['itl_ms_p50']:.1f} / {lv['itl_ms_p99']:.1f}",
                             f"{lv['itl_p99_over_p50']:.2f}",
                             f"{lv['ttft_ms_p50']:.0f} / {lv['ttft_ms_p99']:.0f}",
                             f"{lv['goodput_tok_s']:.1f}"))
    return table(["run", "commit", "config", "rate /s", "requests", "in-server step ms",
                   "device ms (engine call)", "in-server ÷ device", "ITL p50 / p99 ms",
                   "ITL p99 ÷ p50", "TTFT p50 / p99 ms", "tokens/s"], rows)


def step_kinds(runs: Named) -> list[str]:
    """A load run's steps by kind (``bench_load``'s ``step_kinds``), per configuration and
    rate: steps, wall (the loop's host time), device and gap p50 / p99, and the session
    gaps in the all-kinds p99 tail. Levels of runs made before the breakdown existed are
    left out."""
    (_, r), = runs
    rows = []
    for run in r["configs"]:
        for lv in run["levels"]:
            kinds = lv.get("step_kinds")
            if not kinds:
                continue
            for kind, k in kinds["kinds"].items():
                rows.append((run["config"]["name"], f"{lv['rate_per_s']:g}", kind, k["steps"],
                             *(f"{dash(k[t]['p50'], '.1f')} / {dash(k[t]['p99'], '.1f')}"
                               for t in ("wall_ms", "device_ms", "gap_ms")),
                             f"{k['gaps_in_tail']} of {kinds['gap_ms']['n']}"))
    return table(["config", "rate /s", "step kind", "steps", "wall p50 / p99 ms",
                  "device p50 / p99 ms", "gap p50 / p99 ms", "gaps in the p99 tail"], rows)


def prefill_parts(runs: Named) -> list[str]:
    """The prefill's parts, eager (before) against graphed (now)."""
    (_, r), = runs

    def span(values: list[float]) -> str:
        return f"{min(values):.0f}–{max(values):.0f}"

    rows = [
        ("prefill: 8 frames + the 2,103-token prompt, tower included",
         f"{r['prefill_ms_eager']:.1f}", f"{r['prefill_ms_graphed']:.1f}"),
        ("video tower + projector + splice", f"{r['tower_ms_eager']:.1f}",
         f"{r['tower_ms_graphed']:.1f}"),
        ("a prompt length not seen before: first call (3 lengths)",
         span(r["new_length_first_ms_eager"]), span(r["new_length_first_ms_graphed"])),
        ("the same 3 lengths again", span(r["new_length_again_ms_eager"]),
         span(r["new_length_again_ms_graphed"])),
        (f"a {r['question_tokens']}-token question after a reused prefix",
         f"{r['question_after_prefix_ms_eager']:.1f}",
         f"{r['question_after_prefix_ms_graphed']:.1f}"),
    ]
    return table(["part, ms", "eager (before)", "graphed (now)"], rows)


def mixed_steps(runs: Named) -> list[str]:
    """A step of B sessions alone and with a 512-row prompt piece, ms."""
    (_, r), = runs
    m = r["mixed_step"]
    sessions = sorted(int(k[1:].split("_")[0]) for k in m if k.endswith("_step_ms"))
    rows = [(b, f"{m[f'B{b}_step_ms']:.1f}", f"{m[f'B{b}_mixed_graphed_ms']:.1f}",
             f"{m[f'B{b}_mixed_eager_ms']:.1f}", f"{m[f'B{b}_apart_ms']:.1f}") for b in sessions]
    return table(["sessions", "step alone", "with a 512-row piece, graphed", "the same, eager",
                   "the piece in a call of its own, then the step"], rows)


def kv_arena(runs: Named) -> list[str]:
    """Admission-only simulation: per cap mix and layout, sessions holding KV, rate, wait."""
    (_, r), = runs
    rows = [(", ".join(map(str, x["caps"])), x["layout"], f"{x['mean_sessions_holding_kv']:.1f}",
             f"{x['requests_per_s']:.2f}", f"{x['mean_wait_s']:.0f}") for x in r["runs"]]
    return table(["answer caps", "layout", "mean sessions holding KV", "requests/s",
                   "mean wait s"], rows)


def fp8_prefill(runs: Named) -> list[str]:
    """``--prefill-dtype fp8`` against the model's dtype: time, and the answers after it."""
    rows = []
    for _, r in runs:
        ms, a = r["prefill_ms"], r["agreement"]
        rows.append((r["target"], r["device"], f"{r['prompt_tokens']:,}", f"{ms['model']:.2f}",
                     f"{ms['fp8']:.2f}", f"{r['speedup']:.2f}×", a["prompts"],
                     f"{a['first_token_equal']:.0%}", f"{a['answers_identical']:.0%}",
                     f"{a['positions_agreeing']:.1%} of {a['answer_tokens']}"))
    return table(["target", "device", "prompt tokens", "prefill ms, model dtype",
                  "prefill ms, fp8", "speed-up", "prompts", "first token equal",
                  "answers identical", "positions agreeing (teacher-forced)"], rows)


def fp8_gemm(runs: Named) -> list[str]:
    """The 7B decoder's GEMMs at a prompt's rows: bf16 against fp8, 32 layers summed."""
    (_, r), = runs
    rows = [(m, f"{t['bf16_ms']:.1f}", f"{t['fp8_rowwise_ms']:.1f}",
             f"{t['fp8_tensorwise_ms']:.1f}", f"{t['quant_torch_ms']:.1f}",
             f"{t['quant_triton_ms']:.1f}") for m, t in r["per_prefill_32_layers"].items()]
    return table(["rows", "bf16 GEMMs ms", "fp8, per-row scales ms", "fp8, per-tensor ms",
                  "row quantisation, torch ms", "row quantisation, Triton ms"], rows)


def fp8_steps(runs: Named) -> list[str]:
    """An engine with fp8 steps (``step_dtype="fp8"``) against the model dtype's."""
    (_, r), = runs
    s, a = r["steps"], r["all_fp8_agreement"]
    rows = [(key.replace("_", ", ").replace("B", "B = ").replace("k", "k = "),
             f"{s['model'][key]:.2f}", f"{s['fp8'][key]:.2f}",
             f"{s['model'][key] / s['fp8'][key]:.2f}×") for key in s["model"]]
    lines = table(["step", "model dtype ms", "fp8 steps and prefill ms", "speed-up"], rows)
    return [*lines, "", f"All-fp8 answers against the model dtype's ({a['prompts']} prompts, "
                        f"{a['answer_tokens']} tokens): first token equal "
                        f"{a['first_token_equal']:.0%}, answers identical "
                        f"{a['answers_identical']:.0%}, teacher-forced positions agreeing "
                        f"{a['positions_agreeing']:.1%}."]


KINDS: dict[str, Callable[[Named], list[str]]] = {
    "fp8-prefill": fp8_prefill,
    "fp8-steps": fp8_steps,
    "fp8-gemm": fp8_gemm,
    "engine-steps": engine_steps,
    "engine-run": engine_run,
    "engine-attention": engine_attention,
    "invariant-gemm": invariant_gemm,
    "invariant-cost": invariant_cost,
    "batch-invariance-cpu": batch_invariance_cpu,
    "capacity-batches": capacity_batches,
    "capacity-server": capacity_server,
    "server-gap": server_gap,
    "load": load,
    "load-loop": load_loop,
    "step-kinds": step_kinds,
    "prefill-parts": prefill_parts,
    "mixed-steps": mixed_steps,
    "kv-arena": kv_arena,
}
