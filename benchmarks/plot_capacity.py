"""Plot ``bench_capacity.py`` results: tokens/s and ms per token against concurrency.

    python -m benchmarks.plot_capacity benchmarks/results/capacity-cuda-*.json \
        --out benchmarks/results/capacity_h200.png

One line per (result file, mode); needs matplotlib (not a dependency of the nodes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", type=Path, nargs="+", help="bench_capacity JSON files")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tps, ax_tok) = plt.subplots(1, 2, figsize=(12, 4.5))
    for path in args.results:
        result = json.loads(path.read_text())
        engine = result["engine"].replace("Engine", "")
        label = f"{engine}, {result['max_new_tokens']} tokens"
        for mode in dict.fromkeys(lv["mode"] for lv in result["levels"]):
            levels = [lv for lv in result["levels"] if lv["mode"] == mode]
            n = [lv["concurrency"] for lv in levels]
            short = "target-only" if mode == "target_only" else "oracle edge α=0.8 k=4"
            style = "-o" if mode == "target_only" else "--s"
            ax_tps.plot(n, [lv["tokens_per_s"] for lv in levels], style,
                        label=f"{label}, {short}")
            ax_tok.plot(n, [lv["in_server_step_ms"] for lv in levels], style,
                        label=f"{label}, {short}")
    for ax, title in ((ax_tps, "answer tokens/s through the server"),
                      (ax_tok, "in-server step ms (engine + sampler + loop)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent requests N")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    ax_tps.legend(fontsize=7)
    fig.suptitle("bench_capacity.py, full-size Video-LLaVA-7B shape, random bf16 weights, "
                 "H200")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
