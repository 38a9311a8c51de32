"""Markdown tables of committed benchmark results, one function per kind of run.

``tools/render_results.py`` calls these to fill the ``<!-- results: ... -->`` blocks of
``docs/results/*.md``. They live here, apart from the benchmarks that write the JSON,
so that rendering the docs needs neither torch nor the benchmarks' imports (issue 37:
tests do not import ``benchmarks/``), and so that a table in the docs is never typed by
hand: change a format here, re-render, and every page follows.

Each function takes ``[(label, result), ...]`` (the label is what the marker gave after
``=``, else the file's stem) and returns the table's lines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Named = Sequence[tuple[str, dict[str, Any]]]


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _dash(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _mode(mode: str) -> str:
    return "target-only" if mode == "target_only" else "oracle edge"


def engine_steps(runs: Named) -> list[str]:
    """The static engine's step per (B, k) against its bandwidth floor."""
    (_, r), = runs
    replay = r.get("replay_only_ms", {})
    rows = [(s["B"], s["k"], f"{s['ms']:.2f}",
             _dash(replay.get("B{}_q{}".format(s["B"], s["k"] + 1)), ".2f"),
             f"{s['floor_ms']:.2f}", f"{s['ratio']:.2f}") for s in r["steps"]]
    return _table(["B", "k", "step ms", "graph replay alone ms", "floor ms", "step / floor"],
                  rows)


def token_adapter(runs: Named) -> list[str]:
    """Top-1 and 8-draft acceptance, τ and cost per drafting backend (toy pair, CPU)."""
    (_, r), = runs
    rows = []
    for name, b in r["backends"].items():
        by_pos = " / ".join(_dash(a, ".2f") for a in b["acceptance_by_position"][:4])
        cost = (f"{b['macs_per_token'] / 1e3:.0f}k MACs ({b['cost_vs_drafter_macs']:.1%}), "
                f"{b['head_ms']:.3f} ms" if b["macs_per_token"] else "–")
        rows.append((name, f"{b['top1_acceptance']:.3f}", f"{b['acceptance_rate']:.3f}", by_pos,
                     f"{b['tau']:.2f}", f"{b['reference_model']['speedup']:.2f}×", cost))
    return _table(["drafting", "top-1 acceptance", "acceptance rate (8 drafts)",
                   "by draft position 1 / 2 / 3 / 4", "τ", "reference model speedup",
                   "cost per draft token"], rows)


def capacity_cpu(runs: Named) -> list[str]:
    """Throughput at N = 1, 4, 16 (× one at a time) and latency at 16, per run and mode."""
    rows = []
    for label, r in runs:
        ratios = r["throughput_vs_one_at_a_time"]
        for mode, text in (("target_only", "target-only"),
                           ("oracle_edge_alpha0.8_k4", "oracle edge α 0.8")):
            levels = {lv["concurrency"]: lv for lv in r["levels"] if lv["mode"] == mode}
            cells = [f"{levels[n]['tokens_per_s']:.1f} ({ratios[f'{mode}@{n}']:.2f}×)"
                     for n in (1, 4, 16)]
            top = levels[16]
            rows.append((label, text, *cells,
                         f"{top['latency_p50_s']:.3f} / {top['latency_p99_s']:.3f}"))
    return _table(["run", "mode", "N = 1 tokens/s", "N = 4", "N = 16",
                   "p50 / p99 s at N = 16"], rows)


def capacity_gpu(runs: Named) -> list[str]:
    """Per mode and N through the server: throughput, latency, TTFT and the step."""
    (_, r), = runs
    ratios = r["throughput_vs_one_at_a_time"]
    rows = []
    for lv in r["levels"]:
        key = next(k for k in ratios if k.startswith(lv["mode"]) and
                   k.endswith(f"@{lv['concurrency']}"))
        rows.append((_mode(lv["mode"]), lv["concurrency"],
                     f"{lv['tokens_per_s']} ({ratios[key]:.2f}×)",
                     f"{lv['latency_p50_s']} / {lv['latency_p99_s']}", f"{lv['ttft_p50_ms']:.1f}",
                     lv["ms_per_token_p50"], f"{lv['in_server_step_ms']:.2f}",
                     lv["tokens_per_target_step"]))
    return _table(["mode", "N", "tokens/s (× N = 1 target-only)", "p50 / p99 s", "TTFT ms",
                   "ms/token p50", "in-server step ms", "tokens / step"], rows)


def server_gap(runs: Named) -> list[str]:
    """The in-server step against the engine call's device time, and KV held at once."""
    (_, r), = runs
    rows = [(_mode(lv["mode"]), lv["concurrency"], lv["tokens_per_s"], f"{lv['ttft_p50_ms']:.0f}",
             f"{lv['in_server_step_ms']:.2f}", f"{lv['engine_device_ms_per_step']:.2f}",
             f"{lv['in_server_step_ms'] / lv['engine_device_ms_per_step']:.2f}",
             lv["max_sessions_in_a_step"], lv["kv_queue_waits"]) for lv in r["levels"]]
    return _table(["mode", "N", "tokens/s", "TTFT p50 ms", "in-server step ms",
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
    return _table(["config (`--configs` name)", "rate /s", "TTFT p50 / p99 ms",
                   "ITL p50 / p99 ms", "tokens/s", "prefix hits"], rows)


def _alpha(point: dict[str, Any], result: dict[str, Any]) -> str:
    """α, with ``@ms`` where the point's drafter is paced otherwise than the run's."""
    base = result["oracle"]["ms_per_token"]
    ms = point.get("draft_ms", base)
    return f"{point['alpha']:g}" + ("" if ms == base else f"@{ms:g}")


def e2e_points(runs: Named) -> list[str]:
    """Per (α, RTT, N): paired speedup, tokens per step, acceptance, the model's view."""
    (_, r), = runs
    rows = []
    for p in r["points"]:
        ratio = p["achieved_over_predicted"]
        rows.append((_alpha(p, r), f"{p['rtt_ms']:g}", p["clients"], f"{p['spec_ms_p50']:.1f}",
                     f"{p['target_ms_p50']:.1f}", f"{p['speedup_p50']:.3f}",
                     f"{p['speedup_p10']:.3f}", f"{p['share_slower_3pct']:.2f}",
                     _dash(p["tokens_per_step"], ".2f"), _dash(p["acceptance"], ".3f"),
                     f"{p['predicted']['speedup_p50']:.3f}", _dash(ratio, ".3f"),
                     "yes" if p["identical"] else "no",
                     f"{p['hidden_drafted']} / {p['hidden_accepted']} / {p['hidden_budget']}"))
    return _table(["α", "RTT ms", "N", "spec ms", "base ms", "speedup p50", "p10",
                   "> 3% slower", "tokens / step", "acceptance", "model", "achieved ÷ model",
                   "all identical", "hidden drafts (drafted / accepted / budget)"], rows)


def e2e_capacity(runs: Named) -> list[str]:
    """The capacity phase: every client in one mode at a time, all at once."""
    (_, r), = runs
    rows = []
    for p in r["capacity"]:
        s, b = p["speculative"], p["target_only"]
        rows.append((p["max_new_tokens"], p["clients"], f"{s['goodput_tok_s']:.1f}",
                     f"{b['goodput_tok_s']:.1f}", f"{p['goodput_ratio']:.3f}",
                     f"{s['latency_ms_p50']:.0f} / {s['latency_ms_p99']:.0f}",
                     f"{b['latency_ms_p50']:.0f} / {b['latency_ms_p99']:.0f}",
                     f"{b['latency_ms_p50'] / s['latency_ms_p50']:.3f}",
                     _dash(s["tokens_per_step"], ".2f"), f"{p['identical_share']:.2f}"))
    return _table(["answer tokens", "N", "spec tokens/s", "target-only tokens/s", "ratio",
                   "spec p50 / p99 ms", "target-only p50 / p99 ms", "p50 ×",
                   "tokens / step", "identical share"], rows)


def e2e_uplink(runs: Named) -> list[str]:
    """One Ask per feature mode through a shaped uplink: what was sent and what it cost."""
    (_, r), = runs
    rows = []
    for u in r["uplink"]:
        if "error" in u:
            rows.append((f"{u['rate_mbit']:g} Mbit/s", u["requested"], "refused: " + u["error"],
                         "", "", "", ""))
            continue
        rows.append((f"{u['rate_mbit']:g} Mbit/s", u["requested"], u["feature_mode"],
                     f"{u['uplink_bytes']:,}", f"{u['ttft_ms']:,.0f}",
                     f"{u['wire_ms_at_rate']:,.0f}",
                     _dash(u.get("estimate_sample_mbit"), ".1f")))
    return _table(["uplink", "asked", "sent", "bytes", "TTFT ms", "wire ms at the rate",
                   "cloud-timed rate, Mbit/s"], rows)


def e2e_drafter(runs: Named) -> list[str]:
    """Runs of different real drafters (``--drafter real``), one row per run and N."""
    rows = []
    for name, r in runs:
        for p in r["points"]:
            rows.append((name, p["clients"], f"{p['spec_ms_p50']:.0f} / {p['target_ms_p50']:.0f}",
                         f"{p['speedup_p50']:.2f}× (p10 {p['speedup_p10']:.2f})",
                         f"{p['share_slower_3pct']:.2f}", _dash(p["acceptance"], ".2f"),
                         _dash(p["tokens_per_step"], ".2f"),
                         f"{p['predicted']['speedup_p50']:.2f}×"))
    return _table(["drafting", "N", "spec / target-only ms (median)", "speedup median (p10)",
                   "share > 3% slower", "acceptance", "tokens per step", "reference model"],
                  rows)


def invariant_gemm(runs: Named) -> list[str]:
    """The 7B decoder's GEMMs per M: cuBLAS against one batch-invariant tile per shape."""
    (_, r), = runs
    totals = r["gemm"]["decoder_ms"]
    rows = []
    for m in r["gemm"]["rows"]:
        base, inv = totals["cublas"][str(m)], totals["table"][str(m)]
        rows.append((m, f"{base:.2f}", f"{inv:.2f}", f"{inv / base:.2f}"))
    return _table(["M (rows: sessions × tokens)", "cuBLAS ms", "batch-invariant ms", "ratio"],
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
    return _table(["B", "k", "default ms", "`--batch-invariant` ms", "ratio"], rows)


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
    return _table(["part, ms", "eager (before)", "graphed (now)"], rows)


def mixed_steps(runs: Named) -> list[str]:
    """A step of B sessions alone and with a 512-row prompt piece, ms."""
    (_, r), = runs
    m = r["mixed_step"]
    sessions = sorted(int(k[1:].split("_")[0]) for k in m if k.endswith("_step_ms"))
    rows = [(b, f"{m[f'B{b}_step_ms']:.1f}", f"{m[f'B{b}_mixed_graphed_ms']:.1f}",
             f"{m[f'B{b}_mixed_eager_ms']:.1f}", f"{m[f'B{b}_apart_ms']:.1f}") for b in sessions]
    return _table(["sessions", "step alone", "with a 512-row piece, graphed", "the same, eager",
                   "the piece in a call of its own, then the step"], rows)


_DRAFTERS = {"hf": "HF eager", "static": "static, bf16", "static_int8": "static, int8",
             "static_int4": "static, int4"}


def edge_drafter(runs: Named) -> list[str]:
    """The edge's drafters at full size: ms per draft token, prefill, c = t_draft/t_step."""
    rows = []
    for _, r in runs:
        gpu = str(r["device"]).removeprefix("NVIDIA ").split()[0]
        for key, name in _DRAFTERS.items():
            e = r["engines"].get(key)
            if e is None:
                continue
            rows.append((gpu, name, f"{e['draft_ms_per_token']:.2f}",
                         f"{e['step_9_tokens_ms']:.2f} ms",
                         f"{e['prefill_ms']:.1f} ms", f"{e['c_B1']:.2f}", f"{e['c_B16']:.2f}"))
    return _table(["GPU", "drafter", "ms per draft token (median)", "9-token step",
                   "prefill, 737 tokens", "c at B = 1", "c at B = 16"], rows)


def edge_vision(runs: Named) -> list[str]:
    """Five frames through CLIP, projector, adaptor and the adapter, per runtime."""
    (_, r), = runs
    v = r["vision"]
    rows = []
    for key in ("torch", "onnx"):
        t = v[key]
        name = (f"torch eager, {str(t.get('dtype', '')).removeprefix('torch.')}" if key == "torch"
                else f"ONNX Runtime {t['onnxruntime']}, "
                     f"{str(t['provider']).removesuffix('ExecutionProvider')} EP, "
                     f"{t['precision']}, fused")
        rows.append((name, f"{t['clip_ms']:.2f} ms", f"{t['events_ms']:.2f} ms",
                     f"{t['adapter_ms']:.2f} ms", f"{t['total_ms']:.2f} ms"))
    return _table(["runtime", "CLIP", "projector + adaptor + pooling", "adapter", "all"], rows)


def _outcomes(text: object) -> str:
    """``"['INVALID_ARGUMENT']"`` (the JSON keeps a list's repr) as ``INVALID_ARGUMENT``."""
    words = (w.strip(" '\"") for w in str(text).strip("[]").split(","))
    return ", ".join(f"`{w}`" for w in words)


def hardening(runs: Named) -> list[str]:
    """Replicas, faults and load with real processes on loopback."""
    (_, r), = runs
    sp, st, rc, ld, ab = r["spread"], r["sigstop"], r["recovery"], r["load"], r["stops"]
    served = " / ".join(str(n) for n in sp["served_per_replica"])
    shares = " / ".join(f"{s:.0%}" for s in sp["shares"])
    rows = [
        (f"{sp['asks']} Asks in turn, {len(sp['served_per_replica'])} replicas",
         f"{served} Generate streams ({shares})"),
        (f"{st['clients']} clients for {st['stop_s']:g} s while 1 of 2 replicas is SIGSTOPped",
         f"{st['asks']} Asks, {st['failed']} failed, {st['failed_over']} "
         f"({st['hurt_share']:.1%}) waited {st['first_reply_s']:g} s for a Plan and moved, "
         f"slowest {st['slowest_s']:.1f} s of a {st['deadline_s']:g} s deadline"),
        (f"edge serving after its cloud returns from a {rc['outage_s']:g} s outage",
         f"{rc['edge_serving_after_s']:.2f} s (first answer {rc['first_answer_after_s']:.2f} s)"),
        (f"{ld['clients']} clients for {ld['seconds']:g} s, {ld['deadline_s']:g} s deadline",
         f"{ld['asks']} Asks, {ld['answered_in_deadline']} answered within the deadline "
         f"(median {ld['latency_p50_s']:.1f} s)"),
        (f"{ab['clients']} clients while another process keeps sending Asks with 10^6 stop "
         "strings",
         f"{ab['attacks']} such Asks, outcome {_outcomes(ab['attack_outcomes'])} (median "
         f"{ab['attack_refused_median_ms']:.0f} ms); the others' median "
         f"{ab['median_beside_attacker_ms']:.0f} ms against {ab['median_alone_ms']:.0f} ms "
         f"alone ({ab['ratio']:.2f}×)"),
    ]
    return _table(["scenario", "measured"], rows)


def toy_eval(runs: Named) -> list[str]:
    """Accuracy per question type of the target, the draft and the target on adapted
    event features (``eventspec toy eval --json``)."""
    (_, r), = runs
    kinds = list(r["target_accuracy_by_type"])
    rows = [(k, f"{r['target_accuracy_by_type'][k]:.3f}", f"{r['draft_accuracy_by_type'][k]:.3f}",
             f"{r['event_only_accuracy_by_type'][k]:.3f}") for k in kinds]
    rows.append(("all", f"{r['target_accuracy']:.3f}", f"{r['draft_accuracy']:.3f}",
                 f"{r['event_only_accuracy']:.3f}"))
    return _table(["accuracy", "target (frames)", "draft (events only)",
                   "target on adapted event features"], rows)


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
    return _table(["mode", "k = 0, alone vs B = 2 / 4", "k = 8, alone vs B = 2 / 4",
                   "9-token step vs 9 single steps"], rows)


def test_gpu(runs: Named) -> list[str]:
    """``make test-gpu`` summaries: the device, the versions, the counts and the wall."""
    rows = []
    for label, r in runs:
        c = r["counts"]
        rows.append((label, r["device"], r["torch"], r["triton"], c.get("passed", 0),
                     c.get("failed", 0), c.get("skipped", 0), f"{r['wall_s']:.0f}",
                     r["exit_status"]))
    return _table(["run", "device", "torch", "Triton", "passed", "failed", "skipped",
                   "wall s", "exit status"], rows)


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
    return _table(["mode", "N", "tokens/s", "× one at a time", "p50 s", "p99 s",
                   "tokens / step", "batch sizes run"], rows)


def capacity_server(runs: Named) -> list[str]:
    """Per mode and N through the server, with where a request's time went: TTFT at the
    client and in the server, the prefill and its queue wait, the prefill share."""
    (_, r), = runs
    rows = []
    for lv in r["levels"]:
        rows.append((_mode(lv["mode"]), lv["concurrency"], lv["tokens_per_s"],
                     f"{_ratio(r, lv):.2f}", lv["latency_p50_s"], lv["latency_p99_s"],
                     f"{lv['ttft_p50_ms']:.1f} ({lv['server_ttft_p50_ms']:.1f})",
                     f"{lv['prefill_ms_mean']:.1f} + {lv['prefill_wait_ms_mean']:.1f}",
                     lv["ms_per_token_p50"], f"{lv['in_server_step_ms']:.2f}",
                     lv["tokens_per_target_step"], f"{lv['prefill_share_of_wall']:.2f}"))
    return _table(["mode", "N", "tokens/s", "× N=1", "p50 s", "p99 s",
                   "TTFT ms, client (server)", "prefill ms + queue wait", "ms/token p50",
                   "in-server step ms", "tokens / step", "prefill share of wall"], rows)


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
    return _table(["measured", "value"], rows)


def kv_arena(runs: Named) -> list[str]:
    """Admission-only simulation: per cap mix and layout, sessions holding KV, rate, wait."""
    (_, r), = runs
    rows = [(", ".join(map(str, x["caps"])), x["layout"], f"{x['mean_sessions_holding_kv']:.1f}",
             f"{x['requests_per_s']:.2f}", f"{x['mean_wait_s']:.0f}") for x in r["runs"]]
    return _table(["answer caps", "layout", "mean sessions holding KV", "requests/s",
                   "mean wait s"], rows)


def engine_attention(runs: Named) -> list[str]:
    """One layer's attention at the prompt's context, per B × q and implementation, ms."""
    (_, r), = runs
    rows = [(f"{a['B']} × {a['q']}", f"{a['splitkv_ms']:.3f}", f"{a['dense_sdpa_ms']:.3f}",
             f"{a['flex_ms']:.3f}", f"{a['flex_block_mask_ms']:.1f}")
            for a in r["attention_per_layer"]]
    return _table(["B × q", "split-KV (Triton)", "dense masked SDPA over whole slots",
                   "FlexAttention + BlockMask", "building the BlockMask"], rows)


KINDS: dict[str, Callable[[Named], list[str]]] = {
    "engine-steps": engine_steps,
    "token-adapter": token_adapter,
    "capacity-cpu": capacity_cpu,
    "capacity-gpu": capacity_gpu,
    "server-gap": server_gap,
    "load": load,
    "e2e-points": e2e_points,
    "e2e-capacity": e2e_capacity,
    "e2e-uplink": e2e_uplink,
    "e2e-drafter": e2e_drafter,
    "invariant-gemm": invariant_gemm,
    "invariant-cost": invariant_cost,
    "prefill-parts": prefill_parts,
    "mixed-steps": mixed_steps,
    "edge-drafter": edge_drafter,
    "edge-vision": edge_vision,
    "hardening": hardening,
    "toy-eval": toy_eval,
    "batch-invariance-cpu": batch_invariance_cpu,
    "test-gpu": test_gpu,
    "capacity-batches": capacity_batches,
    "capacity-server": capacity_server,
    "engine-run": engine_run,
    "kv-arena": kv_arena,
    "engine-attention": engine_attention,
}
