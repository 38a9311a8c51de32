"""Achieved ÷ predicted for the end-to-end capacity points: each run against the clock.

Why (issue 36, item 6: every point reports achieved ÷ predicted): a capacity point's
tokens per target step fall short of the mechanism's for two reasons, the protocol (a
rejection leaves the next step without drafts unless the tree holds the correction) and
everything else (the host's work per message and node, an edge that falls behind). The
virtual clock (:mod:`benchmarks.pipeline_sim`, checked against real processes) gives
the first alone: it replays the point's settings (the oracle's α, coverage and pace,
the link, the answer length, the edge's tree shape and ``--drafts-every``) at the
speculative steps' own measured length. What the run reaches of that is what the rest
costs.

A speculative step's length is taken from the run: one request's decode time (latency
less time to first token, medians) over its verify steps ((tokens - 1) / tokens per
step). The tree shape is the edge's default at this commit unless the run's edge
arguments set it.

    python -m benchmarks.e2e_clock benchmarks/results/e2e-h200-chains-every1.json ... \\
        --out benchmarks/results/e2e-h200-clock.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.pipeline_sim import Setup, simulate
from benchmarks.stamp import write_result
from eventspec.edge.drafting.tree import TreeShape

#: Edge flags the clock follows, and the Setup / TreeShape field each sets.
SETUP_FLAGS = {"--oracle-coverage": "coverage", "--drafts-every": "drafts_every"}
SHAPE_FLAGS = {"--tree-nodes": "node_budget", "--tree-top-k": "top_k",
               "--tree-per-forward": "per_forward", "--tree-branch-top-k": "branch_top_k"}


def edge_settings(edge_args: Sequence[str]) -> tuple[dict[str, float], dict[str, int]]:
    """The Setup and TreeShape fields the run's ``--edge-args`` set (``--flag=value``)."""
    setup: dict[str, float] = {}
    shape: dict[str, int] = {}
    for arg in edge_args:
        flag, _, value = arg.partition("=")
        if flag in SETUP_FLAGS:
            setup[SETUP_FLAGS[flag]] = float(value)
        elif flag in SHAPE_FLAGS:
            shape[SHAPE_FLAGS[flag]] = int(value)
    return setup, shape


def step_ms(run: dict[str, Any], max_new: int) -> float:
    """A verify step's length in a run of one mode: decode time over verify steps."""
    tps = run["tokens_per_step"] or 1.0
    return (run["latency_ms_p50"] - run["ttft_ms_p50"]) * tps / max(1, max_new - 1)


def predict(result: dict[str, Any], point: dict[str, Any], seeds: int = 5) -> dict[str, Any]:
    """The clock's tokens per step for one capacity point of ``result``, beside the run's."""
    set_fields, shape_fields = edge_settings(result.get("edge_args") or [])
    spec = point["speculative"]
    ms = step_ms(spec, point["max_new_tokens"])
    setup = Setup(alpha=point["alpha"], rtt_ms=point["rtt_ms"], step_ms=ms,
                  draft_ms=result["oracle"]["ms_per_token"],
                  draft_prefill_ms=result["oracle"]["prefill_ms"],
                  tokens=point["max_new_tokens"], max_verify=32,
                  coverage=set_fields.get("coverage", 0.0),
                  drafts_every=int(set_fields.get("drafts_every", 1)),
                  shape=replace(TreeShape(), **shape_fields))
    predicted = statistics.median(simulate(setup, s).tokens_per_step for s in range(seeds))
    achieved = spec["tokens_per_step"]
    return {"clients": point["clients"], "max_new_tokens": point["max_new_tokens"],
            "alpha": point["alpha"], "rtt_ms": point["rtt_ms"],
            "coverage": setup.coverage, "drafts_every": setup.drafts_every,
            "spec_step_ms": ms, "target_step_ms": step_ms(point["target_only"],
                                                          point["max_new_tokens"]),
            "achieved_tokens_per_step": achieved, "predicted_tokens_per_step": predicted,
            "achieved_over_predicted": achieved / predicted if achieved else None}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, nargs="+", help="bench_e2e JSONs with capacity points")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--out", type=Path, default=None, help="also write the rows here, stamped")
    a = p.parse_args(argv)
    rows = []
    for path in a.results:
        result = json.loads(path.read_text())
        if result.get("oracle") is None:
            raise SystemExit(f"{path}: not an oracle run; the clock needs the oracle's pace")
        for point in result.get("capacity") or []:
            rows.append({"file": path.name, **predict(result, point, a.seeds)})
            print(json.dumps(rows[-1]))
    if a.out is not None:
        command = "python -m benchmarks.e2e_clock " + " ".join(
            sys.argv[1:] if argv is None else argv)
        write_result(a.out, {"benchmark": "e2e-clock", "command": command, "seeds": a.seeds,
                             "rows": rows})


if __name__ == "__main__":
    main()
