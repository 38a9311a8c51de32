"""Issue 22's evaluation: the raw misaligned drafter, the token adapter, the draft head
and the aligned pair, on the same held-out toy scenes.

Why: a token adapter or draft head is worth shipping only if the target accepts more
of its drafts than of the raw drafter's, at a small cost per token. This collects a
commit log from toy training scenes (exactly the rows an edge with ``--commit-log``
writes: ``eventspec.demoworld.train.commits``), trains both networks through
``eventspec-edge train-adapter``'s code, then replays greedy speculation against the
toy target's answers on held-out scenes (seeds >= 2,000,000) for each backend:
top-1 acceptance (the seed work's metric: the draft is the target's token, given the
target's prefix), acceptance rate and per-position acceptance with ``--depth`` drafts
per step, and τ (tokens committed per target step). Each acceptance then goes into the
reference model (``tests/support/spec_model.py``) at the issue's anchor (22 ms steps, 5 ms
drafts, RTT 20 ms, 128 tokens, depth 8, width 4) for the speedup it buys.

    python -m benchmarks.bench_token_adapter [--train-scenes 300 --eval-scenes 60]
        [--install] [--out benchmarks/results/token-adapter-toy.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.device_timing import times_ms
from benchmarks.stamp import write_result
from eventspec.cloud.model_dirs import TOY_TARGET_DIR
from eventspec.cloud.target import load_target
from eventspec.demoworld.train.commits import speculate, toy_examples, write_toy_log
from eventspec.edge.drafting.checkpoint import load_draft
from eventspec.edge.drafting.eventgpt import DraftModel
from eventspec.edge.drafting.headed_backend import HeadedDraftBackend
from eventspec.edge.learning.token_heads import (
    HeadCache,
    TokenHead,
    drafter_macs_per_token,
    load_head,
    macs_per_token,
)
from eventspec.edge.learning.train import train_from_log
from eventspec.edge.learning.train_settings import HeadTraining
from eventspec.edge.model_dirs import (
    TOY_DRAFT_DIR,
    TOY_DRAFT_HEAD_DIR,
    TOY_MISALIGNED_DIR,
    TOY_TOKEN_ADAPTER_DIR,
)
from tests.support.spec_model import LinearStepCost, SpecInputs, simulate

EVAL_FIRST_SEED = 2_002_000
ANCHOR = {"step_ms": 22.0, "draft_ms": 5.0, "rtt_ms": 20.0, "tokens": 128, "depth": 8,
          "width": 4}


def reference_speedup(alpha: float) -> dict[str, float]:
    """The reference model at the issue's anchor with drafts right i.i.d. at ``alpha``."""
    inp = SpecInputs(cloud_prefill_ms=54.4, step_cost=LinearStepCost(ANCHOR["step_ms"]),
                     edge_prefill_ms=25.6, draft_ms=ANCHOR["draft_ms"],
                     rtt_ms=ANCHOR["rtt_ms"], alpha=alpha, tokens=int(ANCHOR["tokens"]),
                     depth=int(ANCHOR["depth"]), width=int(ANCHOR["width"]))
    res = simulate(inp, trials=256, seed=0)
    return {"alpha": round(alpha, 4), "speedup": round(res.speedup, 3),
            "tokens_per_step": round(res.tokens_per_step, 3)}


def step_costs(draft: DraftModel, head: TokenHead | None, repeats: int) -> dict[str, float]:
    """Median CPU ms of one drafter step (one token fed) and of the head's step on it."""
    state, _ = draft.prefill("What shape is it?", None,
                             clip_features=torch.zeros(5, draft.tokens_per_frame,
                                                       draft.clip_config.hidden_size))
    base = draft.seq_len(state)

    def one_step() -> None:
        draft.step(state, [5])
        draft.rollback(state, base)

    out = {"drafter_ms": statistics.median(times_ms(one_step, repeats))}
    if head is not None:
        feats, tok = torch.zeros(1, draft.model.config.hidden_size), torch.tensor([5])

        def head_step() -> None:
            with torch.no_grad():
                head.step(HeadCache(), feats, tok)

        out["head_ms"] = statistics.median(times_ms(head_step, repeats))
    return {k: round(v, 4) for k, v in out.items()}


def readme_rows(result: dict[str, Any]) -> list[str]:
    """The README's table rows, from the result JSON (``tests/unit/test_readme.py``)."""
    rows = []
    for name, b in result["backends"].items():
        by_pos = " / ".join("–" if a is None else f"{a:.2f}"
                            for a in b["acceptance_by_position"][:4])
        cost = (f"{b['macs_per_token'] / 1e3:.0f}k MACs ({b['cost_vs_drafter_macs']:.1%}), "
                f"{b['head_ms']:.3f} ms" if b["macs_per_token"] else "–")
        rows.append(f"| {name} | {b['top1_acceptance']:.3f} | {b['acceptance_rate']:.3f} | "
                    f"{by_pos} | {b['tau']:.2f} | {b['reference_model']['speedup']:.2f}× | "
                    f"{cost} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_token_adapter",
                                description=__doc__.split("\n")[0])
    p.add_argument("--train-scenes", type=int, default=300)
    p.add_argument("--eval-scenes", type=int, default=60)
    p.add_argument("--depth", type=int, default=8, help="drafts per step (default 8)")
    p.add_argument("--steps", type=int, default=1500, help="training steps of each network")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--install", action="store_true",
                   help="write the networks to edge/models/toy-token-adapter and "
                        "toy-draft-head (default: a temporary directory)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/token-adapter-toy.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    target = load_target(TOY_TARGET_DIR, dtype=torch.float32)
    raw = load_draft(TOY_MISALIGNED_DIR)
    aligned = load_draft(TOY_DRAFT_DIR)
    train = toy_examples(target, range(args.train_scenes))
    held = toy_examples(target, range(EVAL_FIRST_SEED, EVAL_FIRST_SEED + args.eval_scenes))
    tmp = Path(tempfile.mkdtemp(prefix="eventspec-token-adapter-"))
    source = f"toy training scenes 0-{args.train_scenes - 1}, answers of the toy target"
    write_toy_log(raw, train, tmp / "log", source)
    dirs = ({"adapter": TOY_TOKEN_ADAPTER_DIR, "head": TOY_DRAFT_HEAD_DIR} if args.install
            else {"adapter": tmp / "toy-token-adapter", "head": tmp / "toy-draft-head"})
    training: dict[str, Any] = {}
    for kind, out in dirs.items():
        training[kind] = train_from_log(tmp / "log", out,
                                        HeadTraining(kind=kind, steps=args.steps))  # type: ignore[arg-type]
    heads = {kind: load_head(out) for kind, out in dirs.items()}
    backends: dict[str, Any] = {
        "raw misaligned drafter": (raw, None),
        "token adapter": (HeadedDraftBackend(raw, heads["adapter"]), heads["adapter"]),
        "draft head": (HeadedDraftBackend(raw, heads["head"]), heads["head"]),
        "aligned pair": (aligned, None),
    }
    drafter_macs = drafter_macs_per_token(raw.model)
    rows: dict[str, Any] = {}
    for name, (backend, head) in backends.items():
        spec = speculate(backend, held, args.depth)
        counts = spec.summary()
        alpha = sum(spec.top1_right) / len(spec.top1_right)
        cost = step_costs(raw if name != "aligned pair" else aligned, head, 200)
        macs = macs_per_token(head) if head is not None else 0
        rows[name] = {
            **counts,
            "reference_model": reference_speedup(round(alpha, 4)),
            "parameters": sum(q.numel() for q in head.parameters()) if head else 0,
            "macs_per_token": macs, "drafter_macs_per_token": drafter_macs,
            "cost_vs_drafter_macs": round(macs / drafter_macs, 4),
            **cost,
        }
        print(f"{name:<24} top-1 {counts['top1_acceptance']:.3f}  rate "
              f"{counts['acceptance_rate']:.3f}  τ {counts['tau']:.2f}  speedup "
              f"{rows[name]['reference_model']['speedup']:.2f}x", flush=True)
    result = {
        "what": "issue 22: drafting backends on held-out toy scenes (greedy speculation "
                "replayed against the toy target's answers)",
        "command": "python -m benchmarks.bench_token_adapter "
                   f"--train-scenes {args.train_scenes} --eval-scenes {args.eval_scenes} "
                   f"--depth {args.depth} --steps {args.steps} --threads {args.threads}"
                   + (" --install" if args.install else ""),
        "train_scenes": f"0-{args.train_scenes - 1}",
        "eval_scenes": f"{EVAL_FIRST_SEED}-{EVAL_FIRST_SEED + args.eval_scenes - 1}",
        "train_requests": len(train), "eval_questions": len(held), "depth": args.depth,
        "reference_anchor": ANCHOR, "training": training, "backends": rows,
        "host": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                 "torch": torch.__version__},
        "seconds": round(time.perf_counter() - t0, 1),
        "misaligned_card": json.loads((TOY_MISALIGNED_DIR / "training.json").read_text()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, result, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
