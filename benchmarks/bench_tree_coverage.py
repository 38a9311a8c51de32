"""Issue 36 on CPU: how often a real drafter's top-k holds the target's token (the tree
coverage q), and what trees give over chains, for the toy pair.

Why: the oracle's trees assume a coverage q (the true token is among the drafter's
other top-k children when its top-1 is wrong, with probability q). This measures q for
the real toy drafters at k = 2, 4 and 8 on held-out toy scenes (seeds >= 2,002,000): the
aligned pair, the misaligned drafter alone, and the misaligned drafter with its shipped
token adapter and draft head (``edge/models/toy-token-adapter``, ``toy-draft-head``).
Each position is drafted from the target's own prefix, so q is the drafter's, not the
protocol's. Then each example's answer is replayed through the product's edge and cloud
state machines on a virtual clock (``benchmarks/pipeline_sim.py``: 22 ms target steps,
5 ms draft forwards, RTT 20 ms, the issue-22 anchor) as chains and as trees of the
drafter's real top-4, for tokens per target step.

    python -m benchmarks.bench_tree_coverage [--eval-scenes 40]
        [--out benchmarks/results/tree-coverage-toy.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.pipeline_sim import Setup, replay
from benchmarks.stamp import write_result
from eventspec.cloud.model_dirs import TOY_TARGET_DIR
from eventspec.cloud.target import load_target
from eventspec.demoworld.train.commits import Example, toy_examples
from eventspec.edge.drafting.cache import DraftBackend, DraftCache
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.drafting.headed_backend import HeadedDraftBackend
from eventspec.edge.learning.token_heads import load_head
from eventspec.edge.model_dirs import (
    TOY_DRAFT_DIR,
    TOY_DRAFT_HEAD_DIR,
    TOY_MISALIGNED_DIR,
    TOY_TOKEN_ADAPTER_DIR,
)

EVAL_FIRST_SEED = 2_002_000
KS = (2, 4, 8)
ANCHOR = Setup(alpha=0.8, rtt_ms=20.0, step_ms=22.0, draft_ms=5.0, prefill_ms=50.0,
               draft_prefill_ms=45.0)


def coverage(backend: DraftBackend, examples: list[Example]) -> dict[str, Any]:
    """Top-1 acceptance and, where the top-1 is wrong, the share with the target's token
    among the top k (q at each k of ``KS``), drafting every position from the truth."""
    positions = top1 = 0
    wrong_in = dict.fromkeys(KS, 0)
    for ex in examples:
        drafter = DraftCache(backend)
        drafter.prefill(ex.qa.question, ex.pixels)
        truth = list(ex.answer)
        rows = drafter.expand([truth[:p] for p in range(len(truth))], max(KS))
        for p, row in enumerate(rows):
            ranked = [t for t, _ in row]
            positions += 1
            if ranked[0] == truth[p]:
                top1 += 1
                continue
            for k in KS:
                wrong_in[k] += truth[p] in ranked[1:k]
    wrong = positions - top1
    return {"positions": positions, "top1_acceptance": top1 / positions,
            "q": {str(k): (wrong_in[k] / wrong if wrong else None) for k in KS}}


def tokens_per_step(backend: DraftBackend, examples: list[Example], trees: bool
                    ) -> dict[str, float]:
    """The answers replayed on the virtual clock as chains or trees: tokens per target
    step over all of them (the toy answers are short, so a per-answer median is coarse)
    and the median speedup over target-only alone."""
    tokens = steps = 0
    speedup = []
    for ex in examples:
        drafter = DraftCache(backend)
        drafter.prefill(ex.qa.question, ex.pixels)
        out = replay(ANCHOR, drafter, ex.answer, trees=trees, eos=backend.eos_token_id,
                     vocab=backend.text_vocab_size)
        tokens += out.tokens
        steps += out.steps
        speedup.append(out.speedup)
    return {"tokens_per_step": tokens / max(steps, 1), "tokens": tokens,
            "speedup": statistics.median(speedup)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_tree_coverage",
                                description=__doc__.split("\n")[0])
    p.add_argument("--eval-scenes", type=int, default=40)
    p.add_argument("--max-new", type=int, default=24, help="answer tokens at most")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/tree-coverage-toy.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    target = load_target(TOY_TARGET_DIR, dtype=torch.float32)
    raw = load_draft(TOY_MISALIGNED_DIR)
    backends: dict[str, DraftBackend] = {
        "aligned pair": load_draft(TOY_DRAFT_DIR),
        "misaligned drafter": raw,
        "misaligned + token adapter": HeadedDraftBackend(raw, load_head(TOY_TOKEN_ADAPTER_DIR)),
        "misaligned + draft head": HeadedDraftBackend(raw, load_head(TOY_DRAFT_HEAD_DIR)),
    }
    seeds = range(EVAL_FIRST_SEED, EVAL_FIRST_SEED + args.eval_scenes)
    examples = toy_examples(target, seeds, max_new=args.max_new)
    rows: dict[str, Any] = {}
    for name, backend in backends.items():
        row = coverage(backend, examples)
        row["chains"] = tokens_per_step(backend, examples, trees=False)
        row["trees"] = tokens_per_step(backend, examples, trees=True)
        rows[name] = row
        q = row["q"]
        print(f"{name:<28} top-1 {row['top1_acceptance']:.3f}  q@2 {q['2'] or 0:.3f}  "
              f"q@4 {q['4'] or 0:.3f}  q@8 {q['8'] or 0:.3f}  tokens/step chains "
              f"{row['chains']['tokens_per_step']:.2f} trees {row['trees']['tokens_per_step']:.2f}",
              flush=True)
    write_result(args.out, {
        "benchmark": "tree-coverage",
        "what": "issue 36: the toy drafters' tree coverage q at k = 2, 4, 8 and tokens per "
                "target step with trees against chains (virtual clock)",
        "command": "python -m benchmarks.bench_tree_coverage "
                   f"--eval-scenes {args.eval_scenes} --max-new {args.max_new} "
                   f"--threads {args.threads}",
        "eval_scenes": f"{EVAL_FIRST_SEED}-{EVAL_FIRST_SEED + args.eval_scenes - 1}",
        "questions": len(examples), "clock": {"step_ms": ANCHOR.step_ms,
                                               "draft_ms": ANCHOR.draft_ms,
                                               "rtt_ms": ANCHOR.rtt_ms},
        "backends": rows, "wall_s": time.perf_counter() - t0,
    })
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
