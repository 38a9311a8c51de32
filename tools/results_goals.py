"""An issue's goals table, rendered from the runs that measured it.

A goals table written by hand drifts from its JSON the day one run is redone; this one
is computed, so the figure, the goal and whether it was met come from the same file.
Each input is labelled with the role it plays (``engine_h200-<commit>.json=engine``),
since one measure can need several runs (the prefill reads the engine run and the fp8
run). ``tools/render_results.py`` loads ``KINDS`` beside the other table modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from results_tables import Named, table

#: The roles issue 39's table reads, and the benchmark that writes each one's file.
ISSUE_39_ROLES = {
    "engine": "bench_engine",
    "fp8": "bench_fp8_prefill --target full",
    "invariant": "bench_invariant_cost",
    "load-b1": "bench_load at one session",
    "load-8rps": "bench_load at 8 requests/s",
    "edge": "bench_edge --no-vision",
    "vision": "bench_edge --vision-only",
}


def _by_role(runs: Named) -> dict[str, dict[str, Any]]:
    """The runs keyed by role; a missing or unknown role names itself in the error."""
    roles = dict(runs)
    unknown = sorted(set(roles) - set(ISSUE_39_ROLES))
    missing = sorted(set(ISSUE_39_ROLES) - set(roles))
    if unknown or missing:
        raise ValueError(f"goals-39: roles unknown {unknown}, missing {missing}; label each "
                         f"file with one of {sorted(ISSUE_39_ROLES)} (file.json=role)")
    return roles


def _commit(run: dict[str, Any]) -> str:
    return str(run.get("stamp", {}).get("commit", "?"))[:7]


def _met(ok: bool) -> str:
    return "yes" if ok else "no"


#: A measure's cells: what was measured, the goal, and whether (and how) it was met.
Cells = tuple[str, str, str]


def _step(engine: dict[str, Any], b: int, k: int) -> dict[str, Any]:
    for step in engine["steps"]:
        if step["B"] == b and step["k"] == k:
            return dict(step)
    raise ValueError(f"goals-39: the engine run has no step at B = {b}, k = {k}")


def _invariant_step(invariant: dict[str, Any], b: int, k: int) -> dict[str, Any]:
    for step in invariant["comparison"]["steps"]:
        if step["B"] == b and step["k"] == k:
            return dict(step)
    raise ValueError(f"goals-39: the invariant-cost run has no step at B = {b}, k = {k}")


def _levels(load: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(run["config"]["name"], lv) for run in load["configs"] for lv in run["levels"]]


def _cloud_step(r: dict[str, dict[str, Any]]) -> Cells:
    engine = r["engine"]
    step = _step(engine, 1, 0)
    replay = engine.get("replay_only_ms", {}).get("B1_q1")
    kernels = engine.get("profile", {}).get("B1_k0", {}).get("device_total_ms")
    parts = [f"{step['ms']:.2f} ms"]
    if replay is not None:
        parts.append(f"graph replay {replay:.2f}")
    if kernels is not None:
        parts.append(f"its kernels {kernels:.2f}")
    return "; ".join(parts), "≤ 4.2 ms", _met(step["ms"] <= 4.2)


def _prefill(r: dict[str, dict[str, Any]]) -> Cells:
    bf16, fp8 = r["engine"]["prefill_ms"], r["fp8"]["prefill_ms"]["fp8"]
    agree = r["fp8"]["agreement"]
    text = (f"{bf16:.1f} ms bf16; {fp8:.1f} ms with `--prefill-dtype fp8` (answers identical "
            f"to bf16's: {agree['answers_identical']:.0%} of {agree['prompts']})")
    return text, "≤ 45 ms", f"bf16: {_met(bf16 <= 45)}; fp8 (opt-in): {_met(fp8 <= 45)}"


def _invariant(r: dict[str, dict[str, Any]], what: str) -> Cells:
    if what == "step":
        s = _invariant_step(r["invariant"], 16, 8)
    else:
        s = r["invariant"]["comparison"]["prefill"]
    text = f"{s['ratio']:.2f}× ({s['invariant_ms']:.2f} against {s['default_ms']:.2f} ms)"
    return text, "≤ 1.20×", _met(s["ratio"] <= 1.20)


def _itl(r: dict[str, dict[str, Any]]) -> Cells:
    levels = _levels(r["load-8rps"])
    text = "; ".join(f"{name}: {lv['itl_p99_over_p50']:.2f} (ITL p50 / p99 "
                     f"{lv['itl_ms_p50']:.1f} / {lv['itl_ms_p99']:.1f} ms, {lv['requests']} "
                     f"requests, SLO {_met(lv['meets_slo'])})" for name, lv in levels)
    return text, "≤ 1.5", "; ".join(f"{name}: {_met(lv['itl_p99_over_p50'] <= 1.5)}"
                                    for name, lv in levels)


def _in_server(r: dict[str, dict[str, Any]]) -> Cells:
    levels = [(f"{name} at {lv['rate_per_s']:g}/s", lv)
              for role in ("load-b1", "load-8rps") for name, lv in _levels(r[role])]
    text = "; ".join(f"{name}: {lv['in_server_over_engine']:.2f}" for name, lv in levels)
    return text, "≤ 1.10", _met(all(lv["in_server_over_engine"] <= 1.10 for _, lv in levels))


def _edge_int4(r: dict[str, dict[str, Any]]) -> Cells:
    engines = r["edge"]["engines"]
    int4, bf16 = engines["static_int4"]["prefill_ms"], engines["static"]["prefill_ms"]
    tokens = int(engines["static_int4"]["prefill_tokens"])
    ratio = int4 / bf16
    return (f"{int4:.1f} ms against bf16's {bf16:.1f} ({ratio:.2f}×; {tokens} tokens)",
            "≤ 2× bf16", _met(ratio <= 2.0))


def _vision(r: dict[str, dict[str, Any]]) -> Cells:
    onnx = r["vision"]["vision"]["onnx"]
    plain = onnx.get("without_cuda_graphs", {}).get("total_ms")
    text = f"{onnx['total_ms']:.2f} ms, CLIP {onnx['clip_ms']:.2f} of it ({onnx['name']})"
    if plain is not None:
        text += f"; {plain:.2f} ms without CUDA graphs"
    return text, "≤ 4 ms", _met(onnx["total_ms"] <= 4.0)


#: (measure, the issue's "now", which roles it reads, how it is computed)
_ISSUE_39_ROWS: list[tuple[str, str, tuple[str, ...],
                           Callable[[dict[str, dict[str, Any]]], Cells]]] = [
    ("cloud step, B = 1, k = 0", "5.16 ms", ("engine",), _cloud_step),
    ("prefill, 2,103 tokens", "54.1 ms", ("engine", "fp8"), _prefill),
    ("`--batch-invariant` step, B = 16, k = 8", "1.35×", ("invariant",),
     lambda r: _invariant(r, "step")),
    ("`--batch-invariant` prefill", "1.67×", ("invariant",),
     lambda r: _invariant(r, "prefill")),
    ("ITL p99 ÷ p50, 8 req/s", "2.54", ("load-8rps",), _itl),
    ("in-server ÷ engine step", "up to 1.15", ("load-b1", "load-8rps"), _in_server),
    ("edge int4 prefill", "339 ms (bf16 36)", ("edge",), _edge_int4),
    ("five frames → aligned features, ORT CUDA EP", "8.8 ms (H100)", ("vision",), _vision),
]


def goals_39(runs: Named) -> list[str]:
    """Issue 39's eight goals: the issue's figure, the measured one (with the file's
    commit), the goal, and whether the run met it."""
    r = _by_role(runs)
    rows = []
    for measure, before, roles, compute in _ISSUE_39_ROWS:
        text, goal, met = compute(r)
        commits = ", ".join(sorted({_commit(r[role]) for role in roles}))
        rows.append((measure, before, f"{text} ({commits})", goal, met))
    device = sorted({str(run.get("stamp", {}).get("device", run.get("device", "?")))
                     for run in r.values()})
    return [*table(["measure", "the issue's \"now\"", "measured (commit)", "goal", "met"],
                    rows), "", f"Device: {', '.join(device)}."]


KINDS: dict[str, Callable[[Named], list[str]]] = {"goals-39": goals_39}
