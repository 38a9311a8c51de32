"""``eventspec toy train`` and ``eventspec toy eval``: the toy world, end to end.

Training runs each node's own trainer as a process (``python -m cloud.toy``,
``python -m edge.toy``), so this package never imports the nodes; the target's video
features cross from the cloud's trainer to the edge's adapter trainer as a file.

Evaluation runs the real system: a cloud verifier and an edge agent as processes, the
edge playing the evaluation scenes back to back (scene i is source time [i s, (i+1) s)),
and every question asked over gRPC three ways: speculative with frames (the target's
answer, plus acceptance statistics), draft_only (the edge's EventGPT alone) and
target_only with aligned features (the target fed the adapter's features: event-only).
Answers are scored on their structured content (``shared.toyworld.qa.parse_answer``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shared.client import EdgeClient
from shared.toyworld.qa import all_questions, parse_answer
from shared.toyworld.scenes import EVAL_SEED_MIN, sample_scene
from shared.types import AskSpec, FeatureMode, FinalEvent, GenerationSettings, Mode
from shared.wire.health import wait_for_serving

SCENE_US = 1_000_000


def _run(cmd: list[str]) -> str:
    """Run a trainer step, streaming its progress (stderr) and returning its stdout."""
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"step failed with exit code {out.returncode}: {' '.join(cmd)}")
    return out.stdout


def train(args: argparse.Namespace) -> int:
    py = sys.executable
    t0 = time.perf_counter()
    common = ["--device", args.device] if args.device else []
    scale = ["--scenes", str(args.scenes), "--steps", str(args.steps)]
    with tempfile.TemporaryDirectory(prefix="eventspec-toy-") as tmp:
        feats = str(Path(tmp) / "target_features.safetensors")
        results = {
            "target": json.loads(_run([py, "-m", "cloud.toy", "train", *scale, *common])),
        }
        _run([py, "-m", "cloud.toy", "export-features", "--seeds",
              f"0-{args.adapter_scenes}", "--out", feats, *common])
        results["draft"] = json.loads(_run([py, "-m", "edge.toy", "train-draft", *scale,
                                            *common]))
        results["adapter"] = json.loads(_run([py, "-m", "edge.toy", "train-adapter",
                                              "--features", feats, *common]))
    results["total_seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(results, indent=2))
    return 0


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "wb") as f:
        return subprocess.Popen([sys.executable, "-m", *args], stdout=f,
                                stderr=subprocess.STDOUT, env=env)


async def _port(proc: subprocess.Popen[bytes], port_file: Path, log: Path) -> int:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"a node exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if port_file.exists() and port_file.read_text().strip():
            return int(port_file.read_text())
        await asyncio.sleep(0.1)
    raise SystemExit(f"a node did not start:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


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
    with tempfile.TemporaryDirectory(prefix="eventspec-toy-eval-") as tmp:
        t = Path(tmp)
        feats = t / "features.safetensors"
        _run([sys.executable, "-m", "cloud.toy", "export-features", "--device", "cpu",
              "--seeds", f"{seeds.start}-{seeds.stop}", "--out", str(feats)])
        adapter = json.loads(_run([sys.executable, "-m", "edge.toy", "adapter-metrics",
                                   "--features", str(feats)]))
        cloud = _spawn(["cloud.cli", "serve", "--model", "toy", "--port", "0",
                        "--port-file", str(t / "c"), "--profile", str(t / "p"),
                        "--emulate-prefill-ms", str(args.cloud_prefill_ms),
                        "--emulate-step-ms", str(args.cloud_step_ms)], t / "c.log")
        edge = None
        try:
            cport = await _port(cloud, t / "c", t / "c.log")
            await wait_for_serving(f"127.0.0.1:{cport}", timeout_s=300)
            edge = _spawn(["edge.cli", "serve", "--cloud", f"127.0.0.1:{cport}", "--source",
                           f"toy:{seeds.start}-{seeds.stop}", "--model", "toy",
                           "--speculation", args.speculation, "--port", "0",
                           "--port-file", str(t / "e")], t / "e.log")
            eport = await _port(edge, t / "e", t / "e.log")
            await wait_for_serving(f"127.0.0.1:{eport}", timeout_s=300)
            result = await _ask_all(f"127.0.0.1:{eport}", seeds, args.max_new_tokens,
                                    progress=not args.json)
        finally:
            _stop(edge)
            _stop(cloud)
    result.update({f"adapter_{k}": v for k, v in adapter.items()})
    result["seeds"] = f"{seeds.start}-{seeds.stop}"
    result["cloud_emulation_ms"] = {"prefill": args.cloud_prefill_ms, "step": args.cloud_step_ms}
    return result


def evaluate(args: argparse.Namespace) -> int:
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
    return 0


def add_parser(sub: Any) -> None:
    toy = sub.add_parser("toy", help="train or evaluate the embedded toy-world models")
    tsub = toy.add_subparsers(dest="toy_command", required=True)
    tr = tsub.add_parser("train", help="train target, draft and adapter (GPU: minutes)")
    tr.add_argument("--device", default="", help="cuda or cpu (default: cuda if available)")
    tr.add_argument("--scenes", type=int, default=12000)
    tr.add_argument("--steps", type=int, default=3000)
    tr.add_argument("--adapter-scenes", type=int, default=8000)
    ev = tsub.add_parser("eval", help="accuracy, acceptance and adapter metrics")
    ev.add_argument("--scenes", type=int, default=50)
    ev.add_argument("--seed", type=int, default=EVAL_SEED_MIN + 1000,
                    help="first scene seed; use seeds >= 2,000,000 (never trained or tested on)")
    ev.add_argument("--max-new-tokens", type=int, default=12)
    ev.add_argument("--cloud-prefill-ms", type=float, default=200.0,
                    help="pace the cloud's prefill like an A100-class 7B (0: as fast as it is)")
    ev.add_argument("--cloud-step-ms", type=float, default=30.0,
                    help="pace the cloud's steps like an A100-class 7B (0: as fast as it is)")
    ev.add_argument("--speculation", choices=["auto", "always"], default="auto")
    ev.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    return train(args) if args.toy_command == "train" else evaluate(args)
