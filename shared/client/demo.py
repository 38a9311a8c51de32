"""``eventspec demo``: the whole system on one machine, asked about the demo scene.

Starts a cloud verifier and an edge agent as separate processes on free loopback
ports (through their console entry points, :mod:`eventspec.shared.client.launch`), waits for their
health, warms both modes with one request each, then asks the question ``--runs``
times per mode (alternating which goes first). It prints both answers, the ground truth
of the toy scene, the median total time per mode with its spread (min-max), the speedup
as the ratio of the medians and the drafts summed over the runs, and stops both
processes. One cold request against one warm one is no measurement: that is why.
Exits 3 if any two answers' token ids differ (speculation must be lossless).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from eventspec.shared.client.answer_view import (
    LiveView,
    final_to_json,
    stats_table,
    stream_answer,
    wants_colour,
    wants_live,
    write_timeline,
)
from eventspec.shared.client.edge_client import AskError, EdgeClient
from eventspec.shared.client.launch import start_node, stop_node, wait_for_port
from eventspec.shared.contract import convert
from eventspec.shared.contract.timing import CloudCost
from eventspec.shared.contract.types import AskSpec, FinalEvent, GenerationSettings, Mode
from eventspec.shared.helpfmt import DefaultsHelpFormatter, OneLineParser
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.toyworld.qa import QType, all_questions, parse_answer
from eventspec.shared.toyworld.scenes import DEMO_SEED, sample_scene
from eventspec.shared.wire.channel import open_channel
from eventspec.shared.wire.health import wait_for_serving

DEMO_QUESTION = "Which way is the object moving?"


@dataclass(frozen=True)
class DemoRuns:
    """The measured requests of both modes (the warm-up pair is not among them)."""

    speculative: list[FinalEvent]
    target_only: list[FinalEvent]
    #: One more speculative request, asked for its timeline (``--timeline``).
    timeline: FinalEvent | None = None


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of ``values`` (ms), rounded for printing and JSON."""
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2)}


async def _ask_runs(client: EdgeClient, args: argparse.Namespace) -> DemoRuns:
    """Warm both modes once, then ``--runs`` requests per mode, alternating which goes
    first so neither mode always meets the warmer cache."""
    gen = GenerationSettings(max_new_tokens=args.max_new_tokens, seed=args.seed)
    spec = AskSpec(question=args.question, mode=Mode.SPECULATIVE, generation=gen)
    base = AskSpec(question=args.question, mode=Mode.TARGET_ONLY, generation=gen)
    live = not args.json and wants_live(sys.stdout, os.environ)
    if live:
        view = LiveView(colour=wants_colour(False, os.environ))
        await stream_answer(client, spec, sys.stdout, view)
    else:
        await client.ask_final(spec)
    await client.ask_final(base)
    runs = DemoRuns([], [])
    for i in range(args.runs):
        order = (spec, base) if i % 2 == 0 else (base, spec)
        for s in order:
            final = await client.ask_final(s)
            (runs.speculative if s is spec else runs.target_only).append(final)
    if args.timeline is not None:  # after the measured runs: recording costs them nothing
        drawn = await client.ask_final(dataclasses.replace(spec, timeline=True))
        return dataclasses.replace(runs, timeline=drawn)
    return runs


async def _run(args: argparse.Namespace) -> DemoRuns | None:
    """Start both nodes, warm them, measure both modes, stop both. None on failure."""
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
            # Both nodes bind at once and warm up side by side; the edge reports SERVING
            # once it and its cloud are ready, saying meanwhile what it waits for.
            cport = await wait_for_port(cloud, t / "cloud.port", t / "cloud.log", args.timeout)
            say(f"cloud listening on 127.0.0.1:{cport}; starting the edge agent (EventGPT) ...")
            edge = start_node("eventspec-edge", [
                "serve", "--cloud", f"127.0.0.1:{cport}", "--source", args.source,
                "--model", args.edge_model, "--port", "0",
                "--port-file", str(t / "edge.port")], t / "edge.log")
            eport = await wait_for_port(edge, t / "edge.port", t / "edge.log", args.timeout)
            await wait_for_serving(f"127.0.0.1:{eport}", timeout_s=args.timeout,
                                   on_reason=lambda why: say(f"  ... {why}"))
            cost = await _cloud_cost(f"127.0.0.1:{cport}")
            say(f"edge SERVING on 127.0.0.1:{eport}; the cloud plans with "
                f"{cost.calibration or 'its calibration'}")
            if cost.unreliable:
                say("WARNING: the cloud's calibration failed its own sanity check; timings "
                    "and plans in this run are unreliable (see the warnings below)")
            say(f"asking: {args.question!r} (one warm-up per mode, then {args.runs} each)\n")
            async with EdgeClient(f"127.0.0.1:{eport}", timeout_s=args.timeout) as client:
                return await _ask_runs(client, args)
        except (AskError, RuntimeError, TimeoutError) as exc:
            print(f"demo failed: {exc}", file=sys.stderr)
            return None
        finally:
            stop_node(edge)
            stop_node(cloud)
            for name in ("cloud", "edge"):
                for line in _warnings(t / f"{name}.log"):
                    print(f"{name} log: {line}", file=sys.stderr)


async def _cloud_cost(address: str) -> CloudCost:
    """The cost model the cloud plans with (GetServerInfo), for the demo's header."""
    async with open_channel(address, None) as channel:
        info = await verifier_pb2_grpc.VerifierStub(channel).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=10)
    return convert.cloud_cost_from_pb(info.profile)


def _warnings(log_path: Path) -> list[str]:
    """A node's WARNING and ERROR lines: the demo's logs live in a temporary directory
    that is deleted, so what an operator must see is repeated on stderr."""
    if not log_path.exists():
        return []
    return [line for line in log_path.read_text(errors="replace").splitlines()
            if " WARNING " in line or " ERROR " in line]


def _median_run(finals: list[FinalEvent]) -> FinalEvent:
    """The request whose total time is the median (the lower one for an even count)."""
    ordered = sorted(finals, key=lambda f: f.stats.total_ms)
    return ordered[(len(ordered) - 1) // 2]


def _report(args: argparse.Namespace, runs: DemoRuns) -> int:
    spec_final, base_final = _median_run(runs.speculative), _median_run(runs.target_only)
    answers = {f.token_ids for f in runs.speculative + runs.target_only}
    identical = len(answers) == 1
    truth = scene_truth(args.source, args.question)
    correct = truth is not None and parse_answer(truth[0], spec_final.answer) == truth[1]
    spec_ms = spread([f.stats.total_ms for f in runs.speculative])
    base_ms = spread([f.stats.total_ms for f in runs.target_only])
    speedup = base_ms["median"] / spec_ms["median"] if spec_ms["median"] else 0.0
    drafted = sum(f.stats.drafted for f in runs.speculative)
    accepted = sum(f.stats.accepted for f in runs.speculative)
    hidden = sum(f.stats.hidden_drafted for f in runs.speculative)
    hidden_ok = sum(f.stats.hidden_accepted for f in runs.speculative)
    drafting = sum(bool(f.stats.drafted) for f in runs.speculative)
    if args.json:
        out = final_to_json(spec_final)
        out["question"] = args.question
        out["target_only"] = {
            "answer": base_final.answer,
            "token_ids": list(base_final.token_ids),
            "total_ms": base_ms["median"],
        }
        out["identical"] = identical
        out["speedup"] = round(speedup, 4)
        out["runs"] = args.runs
        out["speculative_total_ms"] = spec_ms
        out["target_only_total_ms"] = base_ms
        out["drafted_total"], out["accepted_total"] = drafted, accepted
        out["hidden_drafted_total"], out["hidden_accepted_total"] = hidden, hidden_ok
        out["runs_drafting"] = drafting
        if truth is not None:
            out["truth"], out["correct"] = truth[1], correct
        print(json.dumps(out))
        if runs.timeline is not None and write_timeline(
                runs.timeline, args.timeline,
                title=f"speculative: {args.question[:80]!r} (eventspec demo)"):
            return 1
        return 0 if identical else 3
    print(f"question:     {args.question}")
    if truth is not None:
        print(f"scene:        {truth[2]}")
    print(f"speculative:  {spec_final.answer!r}")
    print(f"target-only:  {base_final.answer!r}")
    if truth is not None:
        print(f"correct:      {'yes' if correct else 'no'} (ground truth: {truth[1]})")
    print(f"identical token ids: {identical} (all {2 * args.runs} measured requests)")
    print(f"total time, median of {args.runs} after one warm-up each (min-max):")
    print(f"  speculative  {spec_ms['median']:7.1f} ms  ({spec_ms['min']:.1f}-"
          f"{spec_ms['max']:.1f})")
    print(f"  target-only  {base_ms['median']:7.1f} ms  ({base_ms['min']:.1f}-"
          f"{base_ms['max']:.1f})")
    print(f"  speedup (ratio of medians)  {speedup:.2f}x")
    if drafted:
        print(f"drafted / accepted, all {args.runs} speculative runs: {drafted} / {accepted}"
              f" (hidden {hidden} / {hidden_ok}); {drafting} of {args.runs} runs drafted")
    else:
        print(f"no speculation: the plan drafted in none of the {args.runs} runs")
    print("median speculative run:")
    print(stats_table(spec_final))
    if runs.timeline is not None:
        if write_timeline(runs.timeline, args.timeline,
                          title=f"speculative: {args.question[:80]!r} (eventspec demo)"):
            return 1
    else:
        print("(--timeline out.png draws one speculative request's edge and cloud lanes)")
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
    """The ``eventspec demo`` parser; ``--help`` shows every default."""
    demo = OneLineParser(prog="eventspec demo", description=__doc__.split("\n")[0],
                         formatter_class=DefaultsHelpFormatter)
    demo.add_argument("--question", default=DEMO_QUESTION, help="the question asked")
    demo.add_argument("--source", default="toy", help="the edge's --source (toy: the demo "
                                                      "scene)")
    demo.add_argument("--cloud-model", default="toy", help="the cloud's --model")
    demo.add_argument("--edge-model", default="toy", help="the edge's --model")
    demo.add_argument("--cloud-prefill-ms", type=float, default=200.0,
                      help="pace the cloud's prefill like an A100-class 7B (0: unpaced)")
    demo.add_argument("--cloud-step-ms", type=float, default=30.0,
                      help="pace the cloud's steps like an A100-class 7B (0: unpaced)")
    demo.add_argument("--max-new-tokens", type=int, default=32, help="answer tokens at most")
    demo.add_argument("--seed", type=int, default=0, help="sampling seed")
    demo.add_argument("--runs", type=int, default=5,
                      help="measured requests per mode, after one warm-up each")
    demo.add_argument("--timeout", type=float, default=180.0,
                      help="start-up and per-request deadline, s")
    demo.add_argument("--json", action="store_true", help="print one JSON object at the end")
    demo.add_argument("--timeline", type=Path, default=None, metavar="PNG",
                      help="after the measured runs, ask once more and draw that speculative "
                           "request's timeline to this file (needs matplotlib)")
    return demo


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse values the nodes would refuse later, before starting any process."""
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    if not 1 <= args.max_new_tokens <= 512:
        parser.error(f"--max-new-tokens must be in 1..512 (the cloud's cap), got "
                     f"{args.max_new_tokens}")
    if not 0 <= args.seed < 2**64:
        parser.error(f"--seed must be in 0..2^64-1, got {args.seed}")
    for flag, value in (("--cloud-prefill-ms", args.cloud_prefill_ms),
                        ("--cloud-step-ms", args.cloud_step_ms)):
        if not math.isfinite(value) or value < 0:
            parser.error(f"{flag} must be >= 0, got {value:g}")
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        parser.error(f"--timeout must be > 0 s, got {args.timeout:g}")
    if not args.question.strip():
        parser.error("--question is empty")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check(parser, args)
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        runs = asyncio.run(_run(args))
        return 1 if runs is None else _report(args, runs)
    return 130
