"""An engine run's step table and plot (``bench_engine``'s ``--table`` and its
``engine_<card>.png``), from its results JSON alone, so either can be redrawn from a
committed file without the GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.device_timing import floor_text

__all__ = ["markdown", "plot"]


def plot(result: dict[str, Any], path: Path) -> None:
    """The step times by sessions per step, one line per draft count, each with its
    bandwidth floor dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = result["steps"]
    for i, k in enumerate(sorted({r["k"] for r in rows})):
        pts = [r for r in rows if r["k"] == k]
        color = f"C{i}"
        ax.plot([r["B"] for r in pts], [r["ms"] for r in pts], "o-", color=color,
                label=f"k={k} ({k + 1} tokens/session)")  # fmt: skip
        ax.plot([r["B"] for r in pts], [r["floor_ms"] for r in pts], "--", color=color,
                alpha=0.6)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sessions per step (B)")
    ax.set_ylabel("ms per step")
    ax.set_title(f"static engine step, {result['device']} (dashed: bandwidth floor)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(result: dict[str, Any]) -> str:
    """The README table of a results JSON (``--table PATH``)."""
    replay = result.get("replay_only_ms", {})
    lines = [
        "| B | k | step ms | graph replay alone ms | floor ms | step / floor |",
        "|---|---|---|---|---|---|",
    ]
    for s in result["steps"]:
        key = "B{}_q{}".format(s["B"], s["k"] + 1)
        rep = replay.get(key)
        rep_txt = f"{rep:.2f}" if rep is not None else "-"
        lines.append(
            f"| {s['B']} | {s['k']} | {s['ms']:.2f} | {rep_txt} | {floor_text(s['floor_ms'])} "
            f"| {s['ratio']:.2f} |"
        )
    return "\n".join(lines)
