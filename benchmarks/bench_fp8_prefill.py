"""What ``--prefill-dtype fp8`` and the engine's ``step_dtype="fp8"`` buy and cost
(issue 39 item 2): the prefill's and the steps' time against the model's dtype, and how far the
answers agree.

One static engine holds both weight sets; the model-dtype prefill runs with its fp8
copies swapped out. For every prompt (question x clip), slot A is prefilled in the
model's dtype and slot B in fp8, then each decodes greedily on its own for
``--answer-tokens`` (decode steps are the model's dtype in both). Reported:

- ``prefill_ms``: the median whole prefill (tower included) in each mode;
- ``first_token_equal``: the prefill's own argmax agrees;
- ``answers_identical``: the whole greedy answer is the same;
- ``positions_agreeing``: slot C, prefilled in fp8, is fed A's answer (teacher forcing)
  and its argmax compared with A's next token at every position: the share that agree.

With ``--steps``, a second engine with fp8 steps and prefill (``step_dtype`` and
``prefill_dtype`` "fp8") is built on the same target, and ``steps`` gets both engines'
step times at the prompt's context (B = 1, k = 0 and B = 16, k = 8, medians) and
``all_fp8_agreement``: its greedy answers against the model-dtype engine's (first
token, whole answers, teacher-forced positions as above).

Run ``python -m benchmarks.bench_fp8_prefill --target full`` on the GPU machine
(random 7B-shaped weights; timing does not depend on their values), ``--target toy``
for the shipped toy target, ``--target tiny`` for a CPU smoke run; writes
``fp8-prefill-<target>-<card>.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.device_timing import median_ms
from benchmarks.engine_agreement import pixels
from benchmarks.engine_prefill import fill_slots
from benchmarks.stamp import card_tag, write_result
from eventspec.cloud.engine.base import PrefillRequest
from eventspec.cloud.engine.static.build import (
    build_static_engine,
    kv_bytes_per_slot,
    static_kv_plan,
)
from eventspec.cloud.engine.static.engine import StaticEngine
from eventspec.cloud.model_dirs import model_dir
from eventspec.cloud.target import TargetModel, load_target
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.node.static.batch import StepBatch
from eventspec.shared.node.static.weights import LanguageWeights

QUESTIONS = ("What is moving in the scene, and which way does it go?",
             "How many objects are there?", "Describe the scene.",
             "Is anything turning left?")


def load(target: str) -> TargetModel:
    if target == "tiny":
        return build_tiny_random_target(seed=0)
    if target == "toy":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        return load_target(model_dir("toy"), device=device, dtype=dtype)
    from tests.support.fullsize import build_full_target

    return build_full_target("cuda")


def _greedy(engine: StaticEngine, slot: int, ctx: int, first: int, n: int,
            forced: list[int] | None = None) -> list[int]:
    """n greedy tokens after ``first`` from ``slot`` (at ``ctx`` positions); with
    ``forced``, feed those tokens instead of its own and return its argmaxes."""
    vocab = engine.target.text_vocab_size
    out, tok = [first], first
    for t in range(n - 1):
        batch = StepBatch((slot,), (ctx + t,), (1,), torch.tensor([tok], device=engine.device))
        nxt = int(engine.step(batch)[0, :vocab].argmax())
        out.append(nxt)
        tok = forced[t + 1] if forced is not None else nxt
    return out


#: An engine, a slot, and the weights its prefill runs on.
Run = tuple[StaticEngine, int, LanguageWeights]


def compare(runs: tuple[Run, Run, Run], target: TargetModel, clips: int,
            answer_tokens: int) -> dict[str, Any]:
    """For every prompt: run A (the reference) and run B (the mode measured) prefill
    and decode greedily on their own; run C (the mode measured) is fed A's answer.
    The share of first tokens and whole answers A and B agree on, and of C's argmaxes
    that are A's next token (teacher-forced positions)."""
    vocab = target.text_vocab_size
    first_equal = identical = agree = positions = prompts = 0
    for question in QUESTIONS:
        ids = target.build_prompt_ids(question)
        for clip in range(clips):
            pix = pixels(target, clip)
            heads = []
            for engine, slot, weights in runs:
                engine.free(slot)
                kept, engine.prefill_weights = engine.prefill_weights, weights
                logits = engine.prefill([PrefillRequest(slot, ids, pixel_values_videos=pix)])
                engine.prefill_weights = kept
                heads.append(int(logits[0, :vocab].argmax()))
            (ea, sa, _), (eb, sb, _), (ec, sc, _) = runs
            a = _greedy(ea, sa, len(ids), heads[0], answer_tokens)
            b = _greedy(eb, sb, len(ids), heads[1], answer_tokens)
            c = _greedy(ec, sc, len(ids), heads[2], answer_tokens, forced=a)
            prompts += 1
            first_equal += heads[0] == heads[1]
            identical += a == b
            agree += sum(x == y for x, y in zip(a, c, strict=True))
            positions += len(a)
    return {"prompts": prompts, "answer_tokens": answer_tokens,
            "first_token_equal": first_equal / prompts, "answers_identical": identical / prompts,
            "positions_agreeing": agree / positions}


#: (sessions, drafts) of the timed steps.
STEP_SHAPES = ((1, 0), (16, 8))


def step_ms(engine: StaticEngine, ctx: int, repeats: int) -> dict[str, float]:
    """Median step at ``ctx`` positions for each of :data:`STEP_SHAPES` (slot 0's KV
    copied to the others: timing does not depend on values)."""
    fill_slots(engine, max(b for b, _ in STEP_SHAPES))
    out = {}
    for b, k in STEP_SHAPES:
        batch = StepBatch(tuple(range(b)), (ctx,) * b, (k + 1,) * b,
                          torch.randint(5, 500, (b * (k + 1),), device=engine.device))
        out[f"B{b}_k{k}"] = median_ms(lambda batch=batch: engine.step(batch), repeats)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=("tiny", "toy", "full"), default="full")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--clips", type=int, default=4, help="clips per question")
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--steps", action="store_true",
                        help="also an all-fp8 engine's steps and answers (a second engine)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    target = load(args.target)
    max_seq = min(target.max_positions, len(target.build_prompt_ids(QUESTIONS[0])) + 320)
    slots = max(b for b, _ in STEP_SHAPES) if args.steps else 3
    kv = static_kv_plan(target, kv_cache_bytes=(slots + 1) * kv_bytes_per_slot(target, max_seq),
                        max_seq_len=max_seq)
    buckets = {"session_buckets": (1, 16) if args.steps else (1,),
               "token_buckets": (1, 9) if args.steps else (1,)}
    t0 = time.perf_counter()
    engine = build_static_engine(target, kv, prefill_dtype="fp8", **buckets)
    build_s = time.perf_counter() - t0
    ids = target.build_prompt_ids(QUESTIONS[0])
    req = PrefillRequest(0, ids, pixel_values_videos=pixels(target, 0))
    fp8_weights = engine.prefill_weights
    times = {}
    for mode, weights in (("model", engine.weights), ("fp8", fp8_weights), ):
        engine.prefill_weights = weights
        times[mode] = median_ms(lambda: (engine.free(0), engine.prefill([req])), args.repeats)
        logging.info("prefill, %s: %.2f ms", mode, times[mode])
    engine.prefill_weights = fp8_weights
    result: dict[str, Any] = {
        "target": args.target,
        "device": torch.cuda.get_device_name() if target.device.type == "cuda" else "cpu",
        "dtype": str(target.dtype).removeprefix("torch."),
        "prompt_tokens": len(ids), "build_s": build_s,
        "prefill_ms": times, "speedup": times["model"] / times["fp8"],
        "agreement": compare(((engine, 0, engine.weights), (engine, 1, fp8_weights),
                              (engine, 2, fp8_weights)), target, args.clips, args.answer_tokens),
    }
    if args.steps:
        engine.prefill_weights = engine.weights  # the model-dtype engine from here on
        all_fp8 = build_static_engine(target, kv, prefill_dtype="fp8", step_dtype="fp8",
                                      **buckets)
        for e in (engine, all_fp8):
            e.free(0)
            e.prefill([req])
        result["steps"] = {"model": step_ms(engine, len(ids), args.repeats),
                           "fp8": step_ms(all_fp8, len(ids), args.repeats)}
        for e in (engine, all_fp8):
            for slot in range(1, slots):
                e.free(slot)
        fp8_runs = ((engine, 0, engine.weights), (all_fp8, 0, all_fp8.prefill_weights),
                    (all_fp8, 1, all_fp8.prefill_weights))
        result["all_fp8_agreement"] = compare(fp8_runs, target, args.clips, args.answer_tokens)
    logging.info("%s", result)
    tag = card_tag(str(result["device"]), "cpu")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_result(Path(args.out, f"fp8-prefill-{args.target}-{tag}.json"), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
