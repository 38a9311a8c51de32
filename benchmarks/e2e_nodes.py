"""The end-to-end benchmark's processes (``benchmarks/bench_e2e.py``): starting and
stopping the cloud and edge nodes, their command lines, and which drafter an edge set
runs (the oracle at a given α and pace, or the edges' own)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from benchmarks.e2e_pool import SEED0
from eventspec.shared.client.launch import Node, start_node, stop_node, wait_for_port
from eventspec.shared.contract.convert_verifier import server_info_from_pb
from eventspec.shared.contract.types import ServerInfo
from eventspec.shared.pb.eventspec.v1 import verifier_pb2, verifier_pb2_grpc
from eventspec.shared.wire.health import wait_for_serving

NODE_START_S = 300.0


@dataclass
class Nodes:
    """The processes this run started (stopped in reverse at the end)."""

    tmp: Path
    procs: list[Any]

    async def start(self, node: Node, name: str, args: Sequence[str],
                    random_cloud: Sequence[str] = ()) -> str:
        """Start ``node serve`` (or, with ``random_cloud``, ``benchmarks.serve_random``
        with those options, passing ``args`` on to its serve) and wait until it serves."""
        log_path, port_file = self.tmp / f"{name}.log", self.tmp / f"{name}.port"
        serve_args = ["--port", "0", "--port-file", str(port_file), *args]
        port_file.unlink(missing_ok=True)  # a reused --logs folder holds an old run's port
        if random_cloud:
            with open(log_path, "wb") as out:
                proc: Any = subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.serve_random", *random_cloud, "--",
                     *serve_args], stdout=out, stderr=subprocess.STDOUT,
                    env=dict(os.environ, PYTHONUNBUFFERED="1"))
        else:
            proc = start_node(node, ["serve", *serve_args], log_path)
        self.procs.append(proc)
        port = await wait_for_port(proc, port_file, log_path, NODE_START_S)
        address = f"127.0.0.1:{port}"
        await wait_for_serving(address, timeout_s=NODE_START_S)
        return address

    def stop(self, count: int | None = None) -> None:
        """Stop the newest ``count`` processes (all by default)."""
        n = len(self.procs) if count is None else count
        for _ in range(n):
            stop_node(self.procs.pop())


def cloud_args(args: argparse.Namespace, max_clients: int) -> list[str]:
    out = ["--model", args.cloud_model, "--max-sessions", str(max_clients + 2),
           "--max-new-tokens", str(max(args.max_new_tokens, *args.capacity_tokens, 16))]
    if args.cloud_prefill_ms > 0 or args.cloud_step_ms > 0:
        out += ["--emulate-prefill-ms", f"{args.cloud_prefill_ms:g}",
                "--emulate-step-ms", f"{args.cloud_step_ms:g}"]
    return out + list(args.cloud_args)


@dataclass(frozen=True)
class Drafter:
    """One ``--alphas`` entry: the oracle's α and its pace (``A`` or ``A@MS``, MS the ms
    per draft token; without it, ``--oracle-ms-per-token``)."""

    alpha: float
    ms_per_token: float
    #: The edges' own drafter (``--drafter real``), not the oracle: α is measured.
    real: bool = False

    @classmethod
    def parse(cls, text: str, default_ms: float) -> Drafter:
        alpha, at, ms = text.partition("@")
        try:
            out = cls(float(alpha), float(ms) if at else default_ms)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--alphas: {text!r} is not ALPHA or ALPHA@MS_PER_TOKEN") from None
        if not (0.0 <= out.alpha <= 1.0 and out.ms_per_token >= 0):
            raise argparse.ArgumentTypeError(
                f"--alphas: {text!r} needs 0 <= ALPHA <= 1 and MS_PER_TOKEN >= 0")
        return out

    @property
    def name(self) -> str:
        return "real" if self.real else f"{self.alpha:g}@{self.ms_per_token:g}"


def edge_args(args: argparse.Namespace, cloud: str, answers: Path, drafter: Drafter,
              profile: Path) -> list[str]:
    if drafter.real:
        return ["--cloud", cloud, "--source", f"toy:{SEED0}-{SEED0 + args.scenes}",
                "--model", args.edge_model, "--speculation", args.speculation,
                "--profile", str(profile), *args.edge_args]
    return ["--cloud", cloud, "--source", f"toy:{SEED0}-{SEED0 + args.scenes}",
            "--model", args.edge_model, "--draft-engine", "oracle",
            "--oracle-answers", str(answers),
            "--oracle-alpha", f"{drafter.alpha:g}", "--oracle-ms-per-token",
            f"{drafter.ms_per_token:g}", "--oracle-prefill-ms",
            f"{args.oracle_prefill_ms:g}", "--oracle-seed", str(args.seed),
            "--acceptance-prior", f"{drafter.alpha:g}", "--speculation", args.speculation,
            "--profile", str(profile), *args.edge_args]


def write_random_adapter(edge_model: str, dst: tuple[int, int, int], out: Path,
                         seed: int) -> Path:
    """An untrained feature adapter from ``edge_model``'s CLIP features (its 5 event
    frames) to the cloud's video geometry ``dst`` (GetServerInfo), written to ``out``.

    For ``--edge-adapter random``: at full size no trained adapter exists, and the uplink
    phase needs aligned features of the real size ([8, 257, 1024] for Video-LLaVA-7B)
    to time their transfer. Its features are not the clip's, so what the cloud answers
    from them is not what it answers from the frames; the phase measures bytes and time.
    """
    from eventspec.edge.drafting.eventgpt import (
        N_EVENT_FRAMES,
        EventGPTConfig,
        clip_config_of,
        image_size_of,
    )
    from eventspec.edge.model_dirs import TINY_RANDOM, draft_dir
    from eventspec.edge.vision.align import build_adapter_for, save_adapter

    if edge_model == TINY_RANDOM:
        from eventspec.demoworld.tiny_draft import tiny_draft_config

        config = tiny_draft_config()
    else:
        config = EventGPTConfig.from_pretrained(str(draft_dir(edge_model)))
    clip = clip_config_of(config)
    patches = (image_size_of(clip) // int(clip.patch_size)) ** 2
    src = (N_EVENT_FRAMES, 1 + patches, int(clip.hidden_size))
    return save_adapter(build_adapter_for(src, dst, seed=seed), out)


async def server_info(address: str) -> ServerInfo:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await verifier_pb2_grpc.VerifierStub(channel).GetServerInfo(
            verifier_pb2.GetServerInfoRequest(), timeout=30)
    return server_info_from_pb(reply)
