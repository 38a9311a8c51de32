"""The load benchmark's plot (``benchmarks/bench_load.py``): TTFT p99, ITL p99 and
goodput against the arrival rate, one line per server configuration, with the SLO; and
the one-line summary of a level's steps by kind (:func:`kinds_line`).

    python -m benchmarks.load_report benchmarks/results/load-h200-chunk512.json

writes the PNG beside the JSON (``load-h200-chunk512.png``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def plot(result: dict[str, Any], path: Path) -> str:
    """One panel each for TTFT p99, ITL p99 (the SLO's lines dashed) and goodput, against
    the rate; a line per configuration and answer length. A note if matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed"
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = (("ttft_ms_p99", "TTFT p99 (ms)", result["slo"]["ttft_p99_ms"]),
              ("itl_ms_p99", "ITL p99 (ms)", result["slo"]["itl_p99_ms"]),
              ("goodput_tok_s", "goodput (tokens/s)", None))
    for ax, (key, label, slo) in zip(axes, panels, strict=True):
        for run in result["configs"]:
            for tokens in sorted({lv["answer_tokens"] for lv in run["levels"]}):
                levels = [lv for lv in run["levels"] if lv["answer_tokens"] == tokens]
                ax.plot([lv["rate_per_s"] for lv in levels], [lv[key] for lv in levels],
                        "o-", label=f"{run['config']['name']}, {tokens} tokens")
        if slo is not None:
            ax.axhline(slo, color="grey", linestyle="--", linewidth=1)
            ax.set_yscale("log")
        ax.set_xlabel("arrivals per second (Poisson)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{result['model']} on {result['device']} ({result['dtype']}); "
                 "dashed: the SLO")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def kinds_line(breakdown: dict[str, Any]) -> str:
    """A level's steps by kind (``SchedulerStats.kinds``' summary) in one line: the
    session gaps' p50/p99, then per kind its steps, gap p50/p99, device p50 and how many
    of its gaps are in the tail (at or over the all-kinds p99)."""
    gaps = breakdown["gap_ms"]
    if not gaps["n"]:
        return "no step gaps recorded"
    parts = [f"{kind} {k['steps']} steps, gap p50/p99 {_ms(k['gap_ms']['p50'])}/"
             f"{_ms(k['gap_ms']['p99'])}, device p50 {_ms(k['device_ms']['p50'])}, "
             f"{k['gaps_in_tail']} in tail" for kind, k in breakdown["kinds"].items()]
    return (f"step gaps p50/p99 {_ms(gaps['p50'])}/{_ms(gaps['p99'])} ms, tail from "
            f"{_ms(breakdown['tail_from_ms'])} ms: " + "; ".join(parts))


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m benchmarks.load_report RESULT.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    print(plot(json.loads(path.read_text()), path.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
