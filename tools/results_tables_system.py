"""Markdown tables of whole-system runs: end to end, the edge's drafter, the token
adapter, the toy world, replicas and faults, and ``make test-gpu``.

The kinds of ``tools/render_results.py`` beside those of ``results_tables.py`` (the
cloud's engine, capacity and load runs), whose table helpers these use; split so that
neither module grows past a few hundred lines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from results_tables import Named, dash, table


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
                     dash(p["tokens_per_step"], ".2f"), dash(p["acceptance"], ".3f"),
                     f"{p['predicted']['speedup_p50']:.3f}", dash(ratio, ".3f"),
                     "yes" if p["identical"] else "no",
                     f"{p['hidden_drafted']} / {p['hidden_accepted']} / {p['hidden_budget']}"))
    return table(["α", "RTT ms", "N", "spec ms", "base ms", "speedup p50", "p10",
                   "> 3% slower", "tokens / step", "acceptance", "model", "achieved ÷ model",
                   "all identical", "hidden drafts (drafted / accepted / budget)"], rows)


def e2e_capacity(runs: Named) -> list[str]:
    """The capacity phase: every client in one mode at a time, all at once (one run, or
    several side by side with a column naming each)."""
    many = len(runs) > 1
    # Runs since --sit-out also count the steps sessions sat out (a column only then).
    sat = any("sat_out_share" in p["speculative"] for _, r in runs for p in r["capacity"])
    rows = []
    for label, r in runs:
        for p in r["capacity"]:
            s, b = p["speculative"], p["target_only"]
            rows.append(((label,) if many else ()) + (
                p["max_new_tokens"], p["clients"], f"{s['goodput_tok_s']:.1f}",
                f"{b['goodput_tok_s']:.1f}", f"{p['goodput_ratio']:.3f}",
                f"{s['latency_ms_p50']:.0f} / {s['latency_ms_p99']:.0f}",
                f"{b['latency_ms_p50']:.0f} / {b['latency_ms_p99']:.0f}",
                f"{b['latency_ms_p50'] / s['latency_ms_p50']:.3f}",
                dash(s["tokens_per_step"], ".2f"), dash(s.get("acceptance"), ".3f"),
                dash(s.get("offered_per_step"), ".2f"))
                + ((dash(s.get("dry_step_share"), ".2f"), dash(s.get("sat_out_share"), ".2f"))
                   if sat else ())
                + (f"{p['identical_share']:.2f}",))
    return table((["run"] if many else []) + [
        "answer tokens", "N", "spec tokens/s", "target-only tokens/s", "ratio",
        "spec p50 / p99 ms", "target-only p50 / p99 ms", "p50 ×", "tokens / step",
        "accepted ÷ verified", "drafts on offer / step"]
        + (["dry steps ÷ steps", "sat out ÷ steps"] if sat else []) + ["identical share"], rows)


def e2e_clock(runs: Named) -> list[str]:
    """Capacity points against the virtual clock at their own step length
    (``benchmarks/e2e_clock.py``): achieved ÷ predicted tokens per step."""
    rows = []
    for _, r in runs:
        for p in r["rows"]:
            rows.append((p["file"].removesuffix(".json"), p["clients"], p["max_new_tokens"],
                         f"{p['spec_step_ms']:.1f}", f"{p['target_step_ms']:.1f}",
                         f"{p['achieved_tokens_per_step']:.2f}",
                         f"{p['predicted_tokens_per_step']:.2f}",
                         dash(p["achieved_over_predicted"], ".2f")))
    return table(["run", "N", "answer tokens", "spec step ms", "target-only step ms",
                  "tokens / step", "clock's tokens / step", "achieved ÷ predicted"], rows)


def pipeline_sim(runs: Named) -> list[str]:
    """The pipeline on a virtual clock (``benchmarks/pipeline_sim.py``): trees against
    chains with nothing but the paces and the link costing time."""
    rows = []
    for _, r in runs:
        for s in r["runs"]:
            tree = s["tree"]
            branch = ("" if tree is None or "branch_top_k" not in tree
                      else f" (top-{tree['branch_top_k']} off the likeliest path)")
            drafts = ("chains" if tree is None else
                      f"trees q = {s['coverage']:g}, {tree['node_budget']} nodes, top-"
                      f"{tree['top_k']}{branch}, {tree['per_forward']} per forward")
            if s.get("sit_out"):
                drafts += f"; sits out when dry ({s['sat_out_share']:.0%} of its steps)"
            if s.get("verify") == "tree":
                drafts += "; every branch verified each step"
            rows.append((drafts, f"{s['step_ms']:g}", f"{s['draft_ms']:g}",
                         f"{s['rtt_ms']:g}", s["tokens"], f"{s['tokens_per_step']:.2f}",
                         f"{s['speedup']:.2f}", f"{s['accepted_over_verified']:.3f}"))
    return table(["drafts", "step ms", "draft ms", "RTT ms", "answer tokens",
                  "tokens / step", "speedup (alone)", "accepted ÷ verified"], rows)


def tree_coverage(runs: Named) -> list[str]:
    """The toy drafters' tree coverage q and tokens per step, trees against chains
    (``benchmarks/bench_tree_coverage.py``)."""
    (_, r), = runs
    rows = []
    for name, b in r["backends"].items():
        q = b["q"]
        rows.append((name, b["positions"], f"{b['top1_acceptance']:.3f}",
                     *(dash(q[k], ".3f") for k in ("2", "4", "8")),
                     f"{b['chains']['tokens_per_step']:.2f}",
                     f"{b['trees']['tokens_per_step']:.2f}"))
    return table(["drafter", "positions", "top-1 right", "q at k = 2", "q at k = 4",
                  "q at k = 8", "tokens / step, chains", "tokens / step, trees"], rows)


def tree_nodes(runs: Named) -> list[str]:
    """A tree node's host cost per stage and wire form (``benchmarks/bench_tree_nodes.py``)."""
    rows = []
    for name, r in runs:
        # a run without the key predates the columns: its "columns" were messages too
        for form in ("messages", "columns") if r.get("columns_on_wire") else ("messages",):
            rows.append((name, form, f"{r['bytes_per_node'][form]:.1f}",
                         f"{r['decode_us_per_node'][form]:.2f}",
                         f"{r['check_us_per_node']:.2f}", f"{r['place_us_per_node']:.2f}"))
    return table(["run", "wire form", "bytes / node", "decode µs / node", "check µs / node",
                  "place µs / node"], rows)


def refused_memory(runs: Named) -> list[str]:
    """A node's resident memory under refused multi-megabyte calls
    (``benchmarks/bench_refused_memory.py``): start, peak, 1 s and 10 s after, MB."""
    rows = []
    for name, r in runs:
        for run in r["runs"]:
            idle = run.get("rss_during_idle_mb", {})
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(run["outcomes"].items()))
            rows.append((name, run["node"], run["kind"],
                         "yes" if run["authenticated"] else "no", run["calls"], outcomes,
                         f"{run['rss_start_mb']:.0f}", f"{run['rss_peak_mb']:.0f}",
                         dash(idle.get("1"), ".0f"), f"{run['rss_after_idle_mb']:.0f}"))
    return table(["run", "node", "calls of", "token", "calls", "outcomes", "start MB",
                  "peak MB", "1 s after MB", "10 s after MB"], rows)


def stream_flood(runs: Named) -> list[str]:
    """Authenticated Generate and main-port health against a token-requiring cloud, alone
    and beside an attacker process flooding it with streams
    (``benchmarks/bench_stream_flood.py``): medians and the worst probe."""
    rows = []
    for name, r in runs:
        base = r["alone"]["generate_p50_ms"]
        for phase in ("alone", "refused", "stalled"):
            p = r.get(phase)
            if p is None:
                continue
            attacker = p.get("attacker", {})
            rows.append((name, phase, p["generates"], f"{p['generate_p50_ms']:.0f}",
                         f"{p['generate_p50_ms'] / base:.2f}×", p["generate_failed_count"],
                         f"{p['health_p50_ms']:.0f}", f"{p['health_p100_ms']:.0f}",
                         dash(attacker.get("opened_per_s"), ",d")))
    return table(["run", "flood", "Generates", "Generate p50 ms", "vs alone", "failed",
                  "health p50 ms", "health p100 ms", "attack streams/s"], rows)


def stop_flood(runs: Named) -> list[str]:
    """Other clients' median latency alone and beside a process flooding refused
    stop-string requests (``benchmarks/bench_stop_flood.py``)."""
    rows = []
    for name, r in runs:
        for path, label in (("edge", "through the edge (`Ask`)"),
                            ("cloud", "against the cloud (`Generate`)")):
            p = r.get(path)
            if p is None:
                continue
            a = p["attacker"]
            rows.append((name, label, f"{p['p50_alone_ms']:.0f}",
                         f"{p['p50_beside_attacker_ms']:.0f}", f"{p['ratio']:.2f}×",
                         f"{a['requests']:,}", dash(a.get("refused_median_ms"), ".0f")))
    return table(["run", "path", "alone p50 ms", "beside the flood p50 ms", "ratio",
                  "attack requests", "attack refused p50 ms"], rows)


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
                     dash(u.get("estimate_sample_mbit"), ".1f")))
    return table(["uplink", "asked", "sent", "bytes", "TTFT ms", "wire ms at the rate",
                   "cloud-timed rate, Mbit/s"], rows)


def e2e_drafter(runs: Named) -> list[str]:
    """Runs of different real drafters (``--drafter real``), one row per run and N."""
    rows = []
    for name, r in runs:
        for p in r["points"]:
            rows.append((name, p["clients"], f"{p['spec_ms_p50']:.0f} / {p['target_ms_p50']:.0f}",
                         f"{p['speedup_p50']:.2f}× (p10 {p['speedup_p10']:.2f})",
                         f"{p['share_slower_3pct']:.2f}", dash(p["acceptance"], ".2f"),
                         dash(p["tokens_per_step"], ".2f"),
                         f"{p['predicted']['speedup_p50']:.2f}×"))
    return table(["drafting", "N", "spec / target-only ms (median)", "speedup median (p10)",
                   "share > 3% slower", "acceptance", "tokens per step", "reference model"],
                  rows)


def token_adapter(runs: Named) -> list[str]:
    """Top-1 and 8-draft acceptance, τ and cost per drafting backend (toy pair, CPU)."""
    (_, r), = runs
    rows = []
    for name, b in r["backends"].items():
        by_pos = " / ".join(dash(a, ".2f") for a in b["acceptance_by_position"][:4])
        cost = (f"{b['macs_per_token'] / 1e3:.0f}k MACs ({b['cost_vs_drafter_macs']:.1%}), "
                f"{b['head_ms']:.3f} ms" if b["macs_per_token"] else "–")
        rows.append((name, f"{b['top1_acceptance']:.3f}", f"{b['acceptance_rate']:.3f}", by_pos,
                     f"{b['tau']:.2f}", f"{b['reference_model']['speedup']:.2f}×", cost))
    return table(["drafting", "top-1 acceptance", "acceptance rate (8 drafts)",
                   "by draft position 1 / 2 / 3 / 4", "τ", "reference model speedup",
                   "cost per draft token"], rows)


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
    return table(["GPU", "drafter", "ms per draft token (median)", "9-token step",
                   "prefill, 737 tokens", "c at B = 1", "c at B = 16"], rows)


def int4_dense(runs: Named) -> list[str]:
    """One 7B decoder layer's int4 matmuls per row count: tinygemm, widen-then-GEMM, bf16."""
    (_, r), = runs
    least = r["int4_dense_min_rows"]
    rows = [(x["rows"], f"{x['tinygemm_ms']:.3f}", f"{x['widen_gemm_ms']:.3f}",
             f"{x['bf16_ms']:.3f}", "widen" if x["rows"] >= least else "tinygemm")
            for x in r["rows"]]
    return table(["rows", "core's tinygemm, ms", "widen, then bf16 GEMM, ms", "bf16, ms",
                  "the drafter takes"], rows)


def edge_vision(runs: Named) -> list[str]:
    """Five frames through CLIP, projector, adaptor and the adapter, per runtime; ONNX
    Runtime with and without CUDA graphs, and TensorRT, where the run has them."""
    (_, r), = runs
    v = r["vision"]
    rows = []
    for key in ("torch", "onnx"):
        t = v[key]
        if key == "torch":
            dtype = str(t.get("dtype", "")).removeprefix("torch.")
            rows.append(_vision_row(f"torch eager, {dtype}", t))
            continue
        ort = (f"ONNX Runtime {t['onnxruntime']}, "
               f"{str(t['provider']).removesuffix('ExecutionProvider')} EP, {t['precision']}, "
               "fused")
        rows.append(_vision_row(ort + (", CUDA graphs" if t.get("cuda_graph") else ""), t))
        if "total_ms" in t.get("without_cuda_graphs", {}):
            rows.append(_vision_row(ort + ", no CUDA graphs", t["without_cuda_graphs"]))
        trt = t.get("tensorrt", {})
        if "total_ms" in trt:
            rows.append(_vision_row(f"ONNX Runtime {t['onnxruntime']}, TensorRT EP, fp16"
                                    + (", CUDA graphs" if trt.get("cuda_graph") else ""), trt))
    return table(["runtime", "CLIP", "projector + adaptor + pooling", "adapter", "all"], rows)


def _vision_row(name: str, t: dict[str, Any]) -> tuple[str, ...]:
    return (name, f"{t['clip_ms']:.2f} ms", f"{t['events_ms']:.2f} ms",
            f"{t['adapter_ms']:.2f} ms", f"{t['total_ms']:.2f} ms")


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
    return table(["scenario", "measured"], rows)


def _cell(text: object) -> str:
    """Text safe in a table cell: no pipe, no tag (``<path>`` would vanish as HTML)."""
    return (str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            .replace("\n", " "))


def reliability(runs: Named) -> list[str]:
    """Issue 38's items, each measurement against what the issue asks for, then the tally."""
    (_, r), = runs
    verdict = {True: "met", False: "**missed**", None: "skipped"}
    rows = [(c["item"], _cell(c["what"]), _cell(c["figure"]), _cell(c["expect"]),
             verdict[c["met"]]) for c in r["checks"]]
    rows.append(("", "**all**", f"{r['met']} of {r['measured']} met"
                 + (f", {r['skipped']} skipped" if r["skipped"] else ""), "", ""))
    return table(["item", "what", "measured", "expected (issue 38)", ""], rows)


def toy_eval(runs: Named) -> list[str]:
    """Accuracy per question type of the target, the draft and the target on adapted
    event features (``eventspec toy eval --json``)."""
    (_, r), = runs
    kinds = list(r["target_accuracy_by_type"])
    rows = [(k, f"{r['target_accuracy_by_type'][k]:.3f}", f"{r['draft_accuracy_by_type'][k]:.3f}",
             f"{r['event_only_accuracy_by_type'][k]:.3f}") for k in kinds]
    rows.append(("all", f"{r['target_accuracy']:.3f}", f"{r['draft_accuracy']:.3f}",
                 f"{r['event_only_accuracy']:.3f}"))
    return table(["accuracy", "target (frames)", "draft (events only)",
                   "target on adapted event features"], rows)


def test_gpu(runs: Named) -> list[str]:
    """``make test-gpu`` summaries: the device, the versions, the counts and the wall."""
    rows = []
    for label, r in runs:
        c = r["counts"]
        rows.append((label, r["device"], r["torch"], r["triton"], c.get("passed", 0),
                     c.get("failed", 0), c.get("skipped", 0), f"{r['wall_s']:.0f}",
                     r["exit_status"]))
    return table(["run", "device", "torch", "Triton", "passed", "failed", "skipped",
                   "wall s", "exit status"], rows)


def gpu_gate(runs: Named) -> list[str]:
    """``make gpu-gate``: each check of each phase, passed or not, and what it saw."""
    rows = [(label, c["check"], "pass" if c["ok"] else "FAIL", c["detail"].replace("|", "/"))
            for label, r in runs for c in r["checks"]]
    return table(["run", "check", "result", "what it saw"], rows)


def gpu_gate_load(runs: Named) -> list[str]:
    """The gate's concurrent-sessions check: requests, outcomes, peaks, GetStats latency."""
    rows = []
    for label, r in runs:
        lv = r["load"]
        outcomes = ", ".join(f"{k} {v}" for k, v in lv["outcomes"].items())
        rows.append((label, lv["requests"], lv["answer_tokens"], outcomes, lv["peak_running"],
                     lv["peak_waiting"], f"{lv['wall_s']:.1f}",
                     dash(lv.get("get_stats_ms_median"), ".1f"),
                     dash(lv.get("get_stats_ms_max"), ".1f"),
                     dash(lv.get("get_stats_timeouts_10s"), "d"),
                     dash(lv.get("messages_built_s"), ".1f")))
    return table(["run", "requests", "answer tokens", "outcomes", "most at once",
                  "most waiting", "wall s", "GetStats ms p50", "max", "GetStats past 10 s",
                  "messages built first, s"], rows)


KINDS: dict[str, Callable[[Named], list[str]]] = {
    "gpu-gate": gpu_gate,
    "gpu-gate-load": gpu_gate_load,
    "e2e-points": e2e_points,
    "e2e-capacity": e2e_capacity,
    "pipeline-sim": pipeline_sim,
    "e2e-clock": e2e_clock,
    "tree-coverage": tree_coverage,
    "tree-nodes": tree_nodes,
    "refused-memory": refused_memory,
    "stream-flood": stream_flood,
    "stop-flood": stop_flood,
    "e2e-uplink": e2e_uplink,
    "e2e-drafter": e2e_drafter,
    "token-adapter": token_adapter,
    "edge-drafter": edge_drafter,
    "int4-dense": int4_dense,
    "edge-vision": edge_vision,
    "hardening": hardening,
    "reliability": reliability,
    "toy-eval": toy_eval,
    "test-gpu": test_gpu,
}
