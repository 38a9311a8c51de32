"""``eventspec toy eval``: the toy pair judged through the real system.

A cloud verifier and an edge agent run as processes (started through their console
entry points), the edge playing the evaluation scenes back to back (scene i is source
time [i s, (i+1) s)), and every question is asked over gRPC three ways: speculative
with frames (the target's answer, plus acceptance statistics), draft_only (the edge's
EventGPT alone) and target_only with aligned features (the target fed the adapter's
features: event-only). Answers are scored on their structured content
(:func:`eventspec.shared.toyworld.qa.parse_answer`). The adapter's agreement with the target's
own features is measured in-process on the same scenes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from eventspec.cloud.model_dirs import TOY_TARGET_DIR
from eventspec.edge.model_dirs import TOY_ADAPTER_DIR, TOY_DRAFT_DIR
from eventspec.shared.client.edge_client import EdgeClient
from eventspec.shared.client.launch import start_node, stop_node, wait_for_port
from eventspec.shared.contract.types import (
    AskSpec,
    FeatureMode,
    FinalEvent,
    GenerationSettings,
    Mode,
)
from eventspec.shared.toyworld.qa import all_questions, parse_answer
from eventspec.shared.toyworld.scenes import sample_scene
from eventspec.shared.wire.health import wait_for_serving

SCENE_US = 1_000_000
#: How long a node may take to load its model and report SERVING.
NODE_START_S = 300.0


def model_dirs(models: Path | None) -> dict[str, Path]:
    """The three models to judge: those of a ``toy train --out`` directory, or the shipped."""
    if models is None:
        return {"target": TOY_TARGET_DIR, "draft": TOY_DRAFT_DIR, "adapter": TOY_ADAPTER_DIR}
    return {"target": models / TOY_TARGET_DIR.name, "draft": models / TOY_DRAFT_DIR.name,
            "adapter": models / TOY_ADAPTER_DIR.name}


async def _ask_all(address: str, seeds: range, max_new: int,
                   progress: bool) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    async with EdgeClient(address, timeout_s=120) as client:
        for i, seed in enumerate(seeds):
            scene = sample_scene(seed)
            window = {"latest_ms": None, "t0_us": i * SCENE_US, "t1_us": (i + 1) * SCENE_US}
            for qa in all_questions(scene):
                gen = GenerationSettings(max_new_tokens=max_new)

                async def ask(mode: Mode, fm: FeatureMode, q: str = qa.question,
                              g: GenerationSettings = gen, w: dict[str, Any] = window
                              ) -> FinalEvent:
                    return await client.ask_final(
                        AskSpec(q, mode=mode, feature_mode=fm, generation=g, **w)
                    )

                spec = await ask(Mode.SPECULATIVE, FeatureMode.FRAMES)
                draft = await ask(Mode.DRAFT_ONLY, FeatureMode.AUTO)
                event_only = await ask(Mode.TARGET_ONLY, FeatureMode.ALIGNED)
                rows.append({
                    "seed": seed, "qtype": qa.qtype, "truth": qa.value,
                    "target": parse_answer(qa.qtype, spec.answer) == qa.value,
                    "draft": parse_answer(qa.qtype, draft.answer) == qa.value,
                    "event_only": parse_answer(qa.qtype, event_only.answer) == qa.value,
                    "drafted": spec.stats.drafted, "accepted": spec.stats.accepted,
                    "steps": spec.stats.target_steps,
                    "hidden_drafted": spec.stats.hidden_drafted,
                    "hidden_accepted": spec.stats.hidden_accepted,
                    "target_answer": spec.answer, "draft_answer": draft.answer,
                })
            if progress:
                print(f"\r  scene {i + 1}/{len(seeds)}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return summarise(rows)


async def _ask_speculative(address: str, seeds: range, max_new: int) -> dict[str, Any]:
    """Every question asked speculatively only: the drafter's acceptance, nothing else."""
    drafted = accepted = steps = questions = 0
    async with EdgeClient(address, timeout_s=120) as client:
        for i, seed in enumerate(seeds):
            for qa in all_questions(sample_scene(seed)):
                final = await client.ask_final(AskSpec(
                    qa.question, mode=Mode.SPECULATIVE, feature_mode=FeatureMode.FRAMES,
                    generation=GenerationSettings(max_new_tokens=max_new),
                    t0_us=i * SCENE_US, t1_us=(i + 1) * SCENE_US))
                drafted += final.stats.drafted
                accepted += final.stats.accepted
                steps += final.stats.target_steps
                questions += 1
    return {
        "questions": questions, "drafted": drafted, "accepted": accepted,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        "mean_accepted_length": round(1 + accepted / steps, 4) if steps else 0.0,
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy overall and by question type, and the speculation statistics."""
    def acc(key: str, subset: list[dict[str, Any]]) -> float:
        return round(sum(r[key] for r in subset) / len(subset), 4) if subset else 0.0

    types = sorted({r["qtype"] for r in rows})
    by = {t: [r for r in rows if r["qtype"] == t] for t in types}
    drafted = sum(r["drafted"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    steps = sum(r["steps"] for r in rows)
    return {
        "questions": len(rows),
        "scenes": len({r["seed"] for r in rows}),
        "target_accuracy": acc("target", rows),
        "draft_accuracy": acc("draft", rows),
        "event_only_accuracy": acc("event_only", rows),
        "target_accuracy_by_type": {t: acc("target", by[t]) for t in types},
        "draft_accuracy_by_type": {t: acc("draft", by[t]) for t in types},
        "event_only_accuracy_by_type": {t: acc("event_only", by[t]) for t in types},
        "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        "mean_accepted_length": round(1 + accepted / steps, 4) if steps else 0.0,
        "drafted": drafted,
        "accepted": accepted,
        "hidden_drafted": sum(r["hidden_drafted"] for r in rows),
        "hidden_accepted": sum(r["hidden_accepted"] for r in rows),
    }


async def _evaluate(args: argparse.Namespace) -> dict[str, Any]:
    seeds = range(args.seed, args.seed + args.scenes)
    dirs = model_dirs(args.models)
    from eventspec.demoworld.train.adapter import adapter_metrics

    adapter = adapter_metrics(dirs["target"], dirs["draft"], dirs["adapter"], seeds,
                              workers=1)
    with tempfile.TemporaryDirectory(prefix="eventspec-toy-eval-") as tmp:
        t = Path(tmp)
        cloud = start_node("eventspec-cloud", [
            "serve", "--model", str(dirs["target"]), "--port", "0",
            "--port-file", str(t / "c"), "--profile", str(t / "p"),
            "--emulate-prefill-ms", str(args.cloud_prefill_ms),
            "--emulate-step-ms", str(args.cloud_step_ms)], t / "c.log")
        edge = None

        async def start_edge(name: str, *extra: str) -> str:
            nonlocal edge
            stop_node(edge)
            edge = start_node("eventspec-edge", [
                "serve", "--cloud", f"127.0.0.1:{cport}",
                "--source", f"toy:{seeds.start}-{seeds.stop}", "--model", str(dirs["draft"]),
                "--adapter", str(dirs["adapter"]), "--speculation", args.speculation,
                "--port", "0", "--port-file", str(t / name), *extra], t / f"{name}.log")
            eport = await wait_for_port(edge, t / name, t / f"{name}.log", NODE_START_S)
            await wait_for_serving(f"127.0.0.1:{eport}", timeout_s=NODE_START_S)
            return f"127.0.0.1:{eport}"

        try:
            cport = await wait_for_port(cloud, t / "c", t / "c.log", NODE_START_S)
            await wait_for_serving(f"127.0.0.1:{cport}", timeout_s=NODE_START_S)
            result = await _ask_all(await start_edge("e"), seeds, args.max_new_tokens,
                                    progress=not args.json)
            by_quant: dict[str, Any] = {}
            for quant in args.draft_quant:
                address = await start_edge(f"e-{quant}", "--draft-engine", "static",
                                           "--draft-quant", quant)
                by_quant[quant] = await _ask_speculative(address, seeds, args.max_new_tokens)
            if by_quant:
                result["by_draft_quant"] = by_quant
        finally:
            stop_node(edge)
            stop_node(cloud)
    result.update({f"adapter_{k}": v for k, v in adapter.items()})
    result["seeds"] = f"{seeds.start}-{seeds.stop}"
    result["cloud_emulation_ms"] = {"prefill": args.cloud_prefill_ms, "step": args.cloud_step_ms}
    return result


def evaluate(args: argparse.Namespace) -> int:
    """Run the evaluation and print its table (or one JSON object with ``--json``)."""
    result = asyncio.run(_evaluate(args))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"toy world evaluation on scenes {result['seeds']} ({result['questions']} questions)")
    types = sorted(result["target_accuracy_by_type"])
    print(f"  {'':<12}{'target':>8}{'draft':>8}{'events→target':>15}")
    for t in types:
        print(f"  {t:<12}{result['target_accuracy_by_type'][t]:>8.3f}"
              f"{result['draft_accuracy_by_type'][t]:>8.3f}"
              f"{result['event_only_accuracy_by_type'][t]:>15.3f}")
    print(f"  {'all':<12}{result['target_accuracy']:>8.3f}{result['draft_accuracy']:>8.3f}"
          f"{result['event_only_accuracy']:>15.3f}")
    print(f"  acceptance rate {result['acceptance_rate']:.3f}, mean accepted length "
          f"{result['mean_accepted_length']:.2f}, hidden drafts accepted "
          f"{result['hidden_accepted']}/{result['hidden_drafted']}")
    print(f"  adapter cosine mean {result['adapter_cos_mean']:.3f}; tokens at cos >= 0.8 / "
          f"0.85 / 0.9: {result['adapter_accept_at_0_8']:.3f} / "
          f"{result['adapter_accept_at_0_85']:.3f} / {result['adapter_accept_at_0_9']:.3f}")
    by_quant = result.get("by_draft_quant", {})
    if by_quant:
        print("  static drafter by --draft-quant (speculative asks only):")
        print(f"  {'quant':<8}{'drafted':>9}{'accepted':>10}{'rate':>8}{'τ':>7}")
        for quant, row in by_quant.items():
            print(f"  {quant:<8}{row['drafted']:>9}{row['accepted']:>10}"
                  f"{row['acceptance_rate']:>8.3f}{row['mean_accepted_length']:>7.2f}")
    return 0
