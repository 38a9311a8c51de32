"""``eventspec``: the client side. ``ask`` questions an edge agent; ``demo`` runs it all.

The demo starts a cloud verifier and an edge agent as separate processes on free
loopback ports (by module name, so this package never imports the nodes), waits for
their health, asks one question speculatively and once target-only, prints both answers
and the statistics, and stops both processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import grpc

from shared import toy_cli
from shared.client import AskError, EdgeClient
from shared.types import (
    AskSpec,
    CommittedEvent,
    FeatureMode,
    FinalEvent,
    GenerationSettings,
    Mode,
    PreviewEvent,
)
from shared.wire.flags import add_client_security_args, client_security_from_args
from shared.wire.health import wait_for_serving

DEMO_QUESTION = "Which way is the object moving?"
MUTED, RESET, CLEAR_LINE = "\x1b[2m", "\x1b[0m", "\r\x1b[2K"
_MODES = {"speculative": Mode.SPECULATIVE, "target_only": Mode.TARGET_ONLY,
          "draft_only": Mode.DRAFT_ONLY}
_FEATURES = {"auto": FeatureMode.AUTO, "frames": FeatureMode.FRAMES,
             "aligned": FeatureMode.ALIGNED}


def final_to_json(final: FinalEvent) -> dict[str, Any]:
    """The ``--json`` object: answer, ids, mode and the statistics."""
    s = final.stats
    return {
        "answer": final.answer,
        "token_ids": list(final.token_ids),
        "mode": final.mode.name.lower(),
        "feature_mode": final.feature_mode.name.lower() if final.feature_mode else None,
        "finish_reason": final.finish_reason.name.lower(),
        "stats": {
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": round(s.acceptance_rate, 4),
            "mean_accepted_length": round(s.mean_accepted_length, 4),
            "hidden_drafted": s.hidden_drafted,
            "hidden_accepted": s.hidden_accepted,
            "target_steps": s.target_steps,
            "ttft_ms": round(s.ttft_ms, 2),
            "total_ms": round(s.total_ms, 2),
            "uplink_bytes": s.uplink_bytes,
            "downlink_bytes": s.downlink_bytes,
            "stale_drafts": s.stale_drafts,
            "stage_ms": {k: round(v, 2) for k, v in sorted(s.stage_ms.items())},
        },
    }


def stats_table(final: FinalEvent) -> str:
    s = final.stats
    rows = [
        ("mode", final.mode.name.lower()),
        ("drafted / accepted", f"{s.drafted} / {s.accepted}"),
        ("acceptance rate", f"{s.acceptance_rate:.2f}"),
        ("mean accepted length", f"{s.mean_accepted_length:.2f}"),
        ("hidden drafted / accepted", f"{s.hidden_drafted} / {s.hidden_accepted}"),
        ("target steps", str(s.target_steps)),
        ("TTFT", f"{s.ttft_ms:.1f} ms"),
        ("total", f"{s.total_ms:.1f} ms"),
        ("uplink / downlink", f"{s.uplink_bytes} / {s.downlink_bytes} bytes"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


async def stream_answer(
    client: EdgeClient, spec: AskSpec, out: TextIO, *, live: bool
) -> FinalEvent:
    """Ask; in a terminal show the muted preview, replaced by committed text."""
    final: FinalEvent | None = None
    committed = ""
    async for event in client.ask(spec):
        if isinstance(event, PreviewEvent) and live:
            out.write(f"{CLEAR_LINE}{committed}{MUTED}{event.text[len(committed):]}{RESET}")
            out.flush()
        elif isinstance(event, CommittedEvent):
            committed = event.text
            if live:
                out.write(f"{CLEAR_LINE}{committed}")
                out.flush()
        elif isinstance(event, FinalEvent):
            final = event
    if live:
        out.write(f"{CLEAR_LINE}")
    if final is None:
        raise AskError(grpc.StatusCode.INTERNAL, "the edge ended the stream without a Final")
    return final


def _spec_from_args(args: argparse.Namespace, mode: Mode | None = None) -> AskSpec:
    return AskSpec(
        question=args.question,
        latest_ms=args.clip_ms,
        event_window_ms=args.event_window_ms,
        mode=mode or _MODES[args.mode],
        generation=GenerationSettings(
            max_new_tokens=args.max_new_tokens, temperature=args.temperature,
            top_p=args.top_p, seed=args.seed,
        ),
        feature_mode=_FEATURES[args.feature_mode],
    )


async def _ask(args: argparse.Namespace) -> int:
    security = client_security_from_args(args, prefix="", env_prefix="EVENTSPEC_")
    async with EdgeClient(args.edge, timeout_s=args.timeout, security=security) as client:
        try:
            live = sys.stdout.isatty() and not args.json
            final = await stream_answer(client, _spec_from_args(args), sys.stdout, live=live)
        except AskError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(final_to_json(final)))
    else:
        label = " [draft_only: unverified edge output]" if final.mode == Mode.DRAFT_ONLY else ""
        print(f"{final.answer}{label}")
        print(stats_table(final))
    return 0


# -- demo ---------------------------------------------------------------------------------


def _start(cmd: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(list(cmd), stdout=log_file, stderr=subprocess.STDOUT, env=env)


async def _wait_port(proc: subprocess.Popen[bytes], port_file: Path, log_path: Path,
                     timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"process exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            )
        if port_file.exists() and port_file.read_text().strip():
            return int(port_file.read_text())
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no port after {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _demo(args: argparse.Namespace) -> int:
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="eventspec-demo-") as tmp:
        t = Path(tmp)

        def say(line: str) -> None:
            if not args.json:
                print(line, file=sys.stderr)

        say(f"starting the cloud verifier (Video-LLaVA, {args.cloud_model}; paced to "
            f"{args.cloud_prefill_ms:g} ms prefill / {args.cloud_step_ms:g} ms per step) ...")
        cloud = _start([py, "-m", "cloud.cli", "serve", "--model", args.cloud_model,
                        "--port", "0", "--port-file", str(t / "cloud.port"),
                        "--profile", str(t / "cloud-profile.msgpack"),
                        "--emulate-prefill-ms", str(args.cloud_prefill_ms),
                        "--emulate-step-ms", str(args.cloud_step_ms)], t / "cloud.log")
        edge: subprocess.Popen[bytes] | None = None
        try:
            cport = await _wait_port(cloud, t / "cloud.port", t / "cloud.log", args.timeout)
            await wait_for_serving(f"127.0.0.1:{cport}", timeout_s=args.timeout)
            say(f"cloud SERVING on 127.0.0.1:{cport}; starting the edge agent (EventGPT) ...")
            edge = _start([py, "-m", "edge.cli", "serve", "--cloud", f"127.0.0.1:{cport}",
                           "--source", args.source, "--model", args.edge_model,
                           "--port", "0", "--port-file", str(t / "edge.port")], t / "edge.log")
            eport = await _wait_port(edge, t / "edge.port", t / "edge.log", args.timeout)
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
            return 1
        finally:
            if edge is not None:
                _stop(edge)
            _stop(cloud)
    identical = spec_final.token_ids == base_final.token_ids
    truth = _scene_truth(args.source, args.question)
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
            out["truth"], out["correct"] = truth[1], _parse(truth[0], spec_final.answer) == truth[1]
        print(json.dumps(out))
    else:
        print(f"question:     {args.question}")
        if truth is not None:
            print(f"scene:        {truth[2]}")
        print(f"speculative:  {spec_final.answer!r}")
        print(f"target-only:  {base_final.answer!r}")
        if truth is not None:
            ok = _parse(truth[0], spec_final.answer) == truth[1]
            print(f"correct:      {'yes' if ok else 'no'} (ground truth: {truth[1]})")
        print(f"identical token ids: {identical}   speedup (target-only / speculative total "
              f"time): {speedup:.2f}x")
        print(stats_table(spec_final))
        if spec_final.plan is not None:
            print(f"  plan: {spec_final.plan.reason}")
    return 0 if identical else 3


def _scene_truth(source: str, question: str) -> tuple[str, str, str] | None:
    """(question type, true value, description) when the demo plays a toy-world scene."""
    from shared.toyworld.qa import all_questions
    from shared.toyworld.scenes import DEMO_SEED, sample_scene

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


def _same_type(qtype: str, question: str) -> bool:
    q = question.lower()
    keys = {"direction": ("which way", "direction", "where"), "colour": ("colour", "color"),
            "shape": ("shape",), "count": ("how many", "count"), "moving": ("anything mov",)}
    return any(k in q for k in keys.get(qtype, ()))


def _parse(qtype: str, answer: str) -> str | None:
    from shared.toyworld.qa import parse_answer

    return parse_answer(qtype, answer)  # type: ignore[arg-type]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eventspec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="ask an edge agent a question")
    ask.add_argument("question")
    ask.add_argument("--edge", default="127.0.0.1:50062", help="HOST:PORT of the edge agent")
    ask.add_argument("--mode", choices=sorted(_MODES), default="speculative")
    ask.add_argument("--feature-mode", choices=sorted(_FEATURES), default="auto")
    ask.add_argument("--clip-ms", type=int, default=None,
                     help="the latest N ms form the clip (default: 1000, or the whole "
                          "recording if it is shorter)")
    ask.add_argument("--event-window-ms", type=int, default=50,
                     help="event window at the clip's end, ms (< 100)")
    ask.add_argument("--max-new-tokens", type=int, default=64)
    ask.add_argument("--temperature", type=float, default=0.0)
    ask.add_argument("--top-p", type=float, default=1.0)
    ask.add_argument("--seed", type=int, default=0)
    ask.add_argument("--timeout", type=float, default=300.0, help="seconds")
    ask.add_argument("--json", action="store_true", help="print one JSON object at the end")
    add_client_security_args(ask, prefix="", env_prefix="EVENTSPEC_", peer="edge agent")
    toy_cli.add_parser(sub)
    demo = sub.add_parser("demo", help="run cloud + edge locally and ask one question")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        if args.command == "ask":
            return asyncio.run(_ask(args))
        if args.command == "toy":
            return toy_cli.run(args)
        return asyncio.run(_demo(args))
    return 130


if __name__ == "__main__":
    sys.exit(main())
