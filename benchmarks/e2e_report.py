"""The end-to-end benchmark's report (``benchmarks/bench_e2e.py``): the table it prints
and the plot of achieved against the reference model's speedup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def plot(result: dict[str, Any], path: Path) -> str:
    """Achieved vs predicted median speedup per point; a note when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed"
    fig, ax = plt.subplots(figsize=(7, 4))
    pts = result["points"]
    names = [f"α{p['alpha']:g}/{p['rtt_ms']:g}ms/N{p['clients']}" for p in pts]
    x = np.arange(len(pts))
    ax.bar(x - 0.2, [p["speedup_p50"] for p in pts], 0.4, label="achieved (median)")
    ax.bar(x + 0.2, [p["predicted"]["speedup_p50"] for p in pts], 0.4,
           label="reference model (median)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(x, names, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("speedup over target-only")
    ax.set_title("Oracle drafter (benchmarks only): achieved vs model", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['draft_engine'] or result['label']}",
             f"{'alpha':>5} {'RTT':>5} {'N':>3} {'spec ms':>8} {'base ms':>8} {'p50':>6} "
             f"{'p10':>6} {'>3%slow':>7} {'tok/step':>8} {'accept':>6} {'model':>6} "
             f"{'ach/mod':>7} same"]
    for p in result["points"]:
        acc = "–" if p["acceptance"] is None else f"{p['acceptance']:.3f}"
        tps = "–" if p["tokens_per_step"] is None else f"{p['tokens_per_step']:.2f}"
        ratio = p["achieved_over_predicted"]
        lines.append(
            f"{p['alpha']:>5g} {p['rtt_ms']:>5g} {p['clients']:>3} {p['spec_ms_p50']:>8.1f} "
            f"{p['target_ms_p50']:>8.1f} {p['speedup_p50']:>6.3f} {p['speedup_p10']:>6.3f} "
            f"{p['share_slower_3pct']:>7.2f} {tps:>8} {acc:>6} "
            f"{p['predicted']['speedup_p50']:>6.3f} "
            f"{'–' if ratio is None else f'{ratio:.3f}':>7} {p['identical']}")
    hidden = [(p["hidden_drafted"], p["hidden_accepted"], p["hidden_budget"])
              for p in result["points"]]
    lines.append("hidden drafts (drafted / accepted / the plans' budget) per point: "
                 + ", ".join(f"{d}/{a}/{b}" for d, a, b in hidden))
    if result.get("uplink"):
        lines.append(f"{'uplink':>7} {'asked':>8} {'used':>8} {'TTFT ms':>8} {'bytes':>8} "
                     f"{'wire ms':>8} aligned fits")
        for u in result["uplink"]:
            lines.append(f"{u['rate_mbit']:>7g} {u['requested']:>8} {u['feature_mode']:>8} "
                         f"{u['ttft_ms']:>8.1f} {u['uplink_bytes']:>8} "
                         f"{u['wire_ms_at_rate']:>8.2f} {u['aligned_fits_uplink']}")
    return "\n".join(lines)
