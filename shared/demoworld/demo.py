"""``eventspec demo``: the whole system on one machine, asked about the demo scene.

Starts a cloud verifier and an edge agent as separate processes on free loopback
ports (through their console entry points, :mod:`shared.launch`), waits for their
health, asks one question speculatively and once target-only, prints both answers,
the ground truth of the toy scene and the statistics, and stops both processes.
Exits 3 if the two answers' token ids differ (speculation must be lossless).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from shared.answer_view import final_to_json, stats_table, stream_answer
from shared.client import AskError, EdgeClient
from shared.demoworld.qa import QType, all_questions, parse_answer
from shared.demoworld.scenes import DEMO_SEED, sample_scene
from shared.launch import start_node, stop_node, wait_for_port
from shared.types import AskSpec, FinalEvent, GenerationSettings, Mode
from shared.wire.health import wait_for_serving

DEMO_QUESTION = "Which way is the object moving?"


async def _run(args: argparse.Namespace) -> tuple[FinalEvent, FinalEvent] | None:
    """Start both nodes, ask speculatively then target-only, stop both. None on failure."""
    with tempfile.TemporaryDirectory(prefix="eventspec-demo-") as tmp:
        t = Path(tmp)

        def say(line: str) -> None:
            if not args.json:
                print(line, file=sys.stderr)

        say(f"starting the cloud verifier (Video-LLaVA, {args.cloud_model}; paced to "
            f"{args.cloud_prefill_ms:g} ms prefill / {args.cloud_step_ms:g} ms per step) ...")
        cloud = start_node("eventspec-cloud", [
            "serve", "--model", args.cloud_model, "--port", "0",
            "--port-file", str(t / "cloud.port"), "--profile", str(t / "cloud-profile.msgpack"),
            "--emulate-prefill-ms", str(args.cloud_prefill_ms),
            "--emulate-step-ms", str(args.cloud_step_ms)], t / "cloud.log")
        edge: subprocess.Popen[bytes] | None = None
        try:
            cport = await wait_for_port(cloud, t / "cloud.port", t / "cloud.log", args.timeout)
            await wait_for_serving(f"127.0.0.1:{cport}", timeout_s=args.timeout)
            say(f"cloud SERVING on 127.0.0.1:{cport}; starting the edge agent (EventGPT) ...")
            edge = start_node("eventspec-edge", [
                "serve", "--cloud", f"127.0.0.1:{cport}", "--source", args.source,
                "--model", args.edge_model, "--port", "0",
                "--port-file", str(t / "edge.port")], t / "edge.log")
            eport = await wait_for_port(edge, t / "edge.port", t / "edge.log", args.timeout)
            await wait_for_serving(f"127.0.0.1:{eport}", timeout_s=args.timeout)
            say(f"edge SERVING on 127.0.0.1:{eport}; asking: {args.question!r}\n")
            async with EdgeClient(f"127.0.0.1:{eport}", timeout_s=args.timeout) as client:
                gen = GenerationSettings(max_new_tokens=args.max_new_tokens, seed=args.seed)
                spec = AskSpec(question=args.question, mode=Mode.SPECULATIVE, generation=gen)
                live = sys.stdout.isatty() and not args.json
                spec_final = await stream_answer(client, spec, sys.stdout, live=live)
                base_final = await client.ask_final(
                    AskSpec(question=args.question, mode=Mode.TARGET_ONLY, generation=gen)
                )
        except (AskError, RuntimeError, TimeoutError) as exc:
            print(f"demo failed: {exc}", file=sys.stderr)
            return None
        finally:
            stop_node(edge)
            stop_node(cloud)
    return spec_final, base_final


def _report(args: argparse.Namespace, spec_final: FinalEvent, base_final: FinalEvent) -> int:
    identical = spec_final.token_ids == base_final.token_ids
    truth = scene_truth(args.source, args.question)
    correct = truth is not None and parse_answer(truth[0], spec_final.answer) == truth[1]
    speedup = (base_final.stats.total_ms / spec_final.stats.total_ms
               if spec_final.stats.total_ms else 0.0)
    if args.json:
        out = final_to_json(spec_final)
        out["question"] = args.question
        out["target_only"] = {
            "answer": base_final.answer,
            "token_ids": list(base_final.token_ids),
            "total_ms": round(base_final.stats.total_ms, 2),
        }
        out["identical"] = identical
        out["speedup"] = round(speedup, 4)
        if truth is not None:
            out["truth"], out["correct"] = truth[1], correct
        print(json.dumps(out))
    else:
        print(f"question:     {args.question}")
        if truth is not None:
            print(f"scene:        {truth[2]}")
        print(f"speculative:  {spec_final.answer!r}")
        print(f"target-only:  {base_final.answer!r}")
        if truth is not None:
            print(f"correct:      {'yes' if correct else 'no'} (ground truth: {truth[1]})")
        print(f"identical token ids: {identical}   speedup (target-only / speculative total "
              f"time): {speedup:.2f}x")
        print(stats_table(spec_final))
        if spec_final.plan is not None:
            print(f"  plan: {spec_final.plan.reason}")
    return 0 if identical else 3


def scene_truth(source: str, question: str) -> tuple[QType, str, str] | None:
    """(question type, true value, description) when the demo plays one toy scene."""
    if source != "toy" and not (source.startswith("toy:") and source[4:].isdigit()):
        return None
    scene = sample_scene(DEMO_SEED if source == "toy" else int(source[4:]))
    objects = " and a ".join(f"{o.colour} {o.shape}" for o in scene.objects)
    motion = "still" if scene.motion == "still" else f"moving {scene.motion}"
    description = f"a {objects}, {motion} (toy-world seed {scene.seed})"
    for qa in all_questions(scene):
        if qa.question.rstrip("?").lower() in question.lower() or _same_type(qa.qtype, question):
            return qa.qtype, qa.value, description
    return None


def _same_type(qtype: QType, question: str) -> bool:
    q = question.lower()
    keys = {"direction": ("which way", "direction", "where"), "colour": ("colour", "color"),
            "shape": ("shape",), "count": ("how many", "count"), "moving": ("anything mov",)}
    return any(k in q for k in keys.get(qtype, ()))


def build_parser() -> argparse.ArgumentParser:
    demo = argparse.ArgumentParser(prog="eventspec demo", description=__doc__.split("\n")[0])
    demo.add_argument("--question", default=DEMO_QUESTION)
    demo.add_argument("--source", default="toy", help="edge source (default: the toy scene)")
    demo.add_argument("--cloud-model", default="toy")
    demo.add_argument("--edge-model", default="toy")
    demo.add_argument("--cloud-prefill-ms", type=float, default=200.0,
                      help="pace the cloud's prefill like an A100-class 7B (0: unpaced)")
    demo.add_argument("--cloud-step-ms", type=float, default=30.0,
                      help="pace the cloud's steps like an A100-class 7B (0: unpaced)")
    demo.add_argument("--max-new-tokens", type=int, default=32)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--timeout", type=float, default=180.0, help="seconds")
    demo.add_argument("--json", action="store_true", help="print one JSON object at the end")
    return demo


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        finals = asyncio.run(_run(args))
        return 1 if finals is None else _report(args, *finals)
    return 130
