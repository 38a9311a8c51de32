"""The end-to-end benchmark's report (``benchmarks/bench_e2e.py``): the table it prints
and the plot of achieved against the reference model's speedup."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(result: dict[str, Any], path: Path) -> str:
    """Speedup against α, one panel per N and one colour per RTT: the achieved medians
    (dots, p10 as bars below them) over the reference model's (dashed); a drafter slower
    than the others (``ALPHA@MS``) is a cross. With a capacity phase, also goodput
    against N (``<path stem>-capacity.png``). A note when matplotlib is absent."""
    try:
        plt = _pyplot()
    except ImportError:
        return "no plot: matplotlib is not installed"
    pts = result["points"]
    ns = sorted({p["clients"] for p in pts})
    rtts = sorted({p["rtt_ms"] for p in pts})
    pace = result["oracle"]["ms_per_token"]
    fig, axes = plt.subplots(1, len(ns), figsize=(4 * len(ns), 3.6), sharey=True,
                             squeeze=False)
    for ax, n in zip(axes[0], ns, strict=True):
        for colour, rtt in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], rtts,
                               strict=False):
            mine = sorted((p for p in pts if p["clients"] == n and p["rtt_ms"] == rtt),
                          key=lambda p: p["alpha"])
            usual = [p for p in mine if p.get("draft_ms", pace) == pace]
            slow = [p for p in mine if p.get("draft_ms", pace) != pace]
            a = [p["alpha"] for p in usual]
            med = np.array([p["speedup_p50"] for p in usual])
            p10 = np.array([p["speedup_p10"] for p in usual])
            ax.errorbar(a, med, yerr=[med - p10, np.zeros_like(med)], fmt="o", color=colour,
                        capsize=2, label=f"RTT {rtt:g} ms")
            ax.plot(a, [p["predicted"]["speedup_p50"] for p in usual], "--", color=colour)
            ax.plot([p["alpha"] for p in slow], [p["speedup_p50"] for p in slow], "x",
                    color=colour, ms=8)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(f"N = {n} concurrent", fontsize=9)
        ax.set_xlabel("α (oracle drafter, benchmarks only)")
    axes[0][0].set_ylabel("speedup over target-only")
    axes[0][0].legend(fontsize=7, title="dots: median (bar to p10); dashed: model; "
                      "x: slow drafter", title_fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    out = [str(path)]
    if result.get("capacity"):
        cap_path = path.with_name(path.stem + "-capacity.png")
        plot_capacity(result["capacity"], cap_path, plt)
        out.append(str(cap_path))
    return ", ".join(out)


def plot_capacity(points: list[dict[str, Any]], path: Path, plt: Any) -> None:
    """Goodput against N, speculative (solid) and target-only (dashed), per answer length."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for colour, tokens in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"],
                              sorted({p["max_new_tokens"] for p in points}), strict=False):
        mine = sorted((p for p in points if p["max_new_tokens"] == tokens),
                      key=lambda p: p["clients"])
        n = [p["clients"] for p in mine]
        ax.plot(n, [p["speculative"]["goodput_tok_s"] for p in mine], "o-", color=colour,
                label=f"{tokens} tokens, speculative")
        ax.plot(n, [p["target_only"]["goodput_tok_s"] for p in mine], "s--", color=colour,
                label=f"{tokens} tokens, target-only")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("goodput, tokens/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['draft_engine'] or result['label']}",
             f"{'alpha':>9} {'RTT':>5} {'N':>3} {'spec ms':>8} {'base ms':>8} {'p50':>6} "
             f"{'p10':>6} {'>3%slow':>7} {'tok/step':>8} {'accept':>6} {'model':>6} "
             f"{'ach/mod':>7} same"]
    for p in result["points"]:
        acc = "–" if p["acceptance"] is None else f"{p['acceptance']:.3f}"
        tps = "–" if p["tokens_per_step"] is None else f"{p['tokens_per_step']:.2f}"
        ratio = p["achieved_over_predicted"]
        lines.append(
            f"{alpha(p, result):>9} {p['rtt_ms']:>5g} {p['clients']:>3} {p['spec_ms_p50']:>8.1f} "
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
            if "error" in u:
                lines.append(f"{u['rate_mbit']:>7g} {u['requested']:>8} refused: {u['error']}")
                continue
            lines.append(f"{u['rate_mbit']:>7g} {u['requested']:>8} {u['feature_mode']:>8} "
                         f"{u['ttft_ms']:>8.1f} {u['uplink_bytes']:>8} "
                         f"{u['wire_ms_at_rate']:>8.2f} {u['aligned_fits_uplink']}")
    return "\n".join(lines)


def drafter_rows(named: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Markdown rows comparing runs of different drafters (``--drafter real``), one per
    run and N: what the README's drafter table shows (``tests/unit/test_readme.py``)."""
    rows = []
    for name, result in named:
        for p in result["points"]:
            acc = "–" if p["acceptance"] is None else f"{p['acceptance']:.2f}"
            tps = "–" if p["tokens_per_step"] is None else f"{p['tokens_per_step']:.2f}"
            rows.append(
                f"| {name} | {p['clients']} | {p['spec_ms_p50']:.0f} / {p['target_ms_p50']:.0f} "
                f"| {p['speedup_p50']:.2f}× (p10 {p['speedup_p10']:.2f}) "
                f"| {p['share_slower_3pct']:.2f} | {acc} | {tps} "
                f"| {p['predicted']['speedup_p50']:.2f}× |")
    return rows


def alpha(point: dict[str, Any], result: dict[str, Any]) -> str:
    """α, with ``@ms`` where the point's drafter is paced otherwise than the run's."""
    ms = point.get("draft_ms", result["oracle"]["ms_per_token"])
    return f"{point['alpha']:g}" + ("" if ms == result["oracle"]["ms_per_token"]
                                    else f"@{ms:g}")


def main(argv: list[str] | None = None) -> int:
    """Redraw the plots and print the tables of a result JSON:
    ``python -m benchmarks.e2e_report benchmarks/results/e2e-h100.json``."""
    import argparse

    from benchmarks.e2e_capacity import capacity_table

    p = argparse.ArgumentParser(prog="python -m benchmarks.e2e_report",
                                description=main.__doc__)
    p.add_argument("result", type=Path)
    args = p.parse_args(argv)
    result = json.loads(args.result.read_text())
    print(plot(result, args.result.with_suffix(".png")))
    print(table(result))
    if result.get("capacity"):
        print(capacity_table(result["capacity"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
