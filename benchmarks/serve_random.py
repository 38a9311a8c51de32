"""A cloud verifier (or edge agent) process over a random model of a given size, for
benchmarks and the GPU gate.

The end-to-end benchmark (``benchmarks/bench_e2e.py``) needs a real cloud *process*
serving a full-size (Video-LLaVA-7B-shaped) target on the GPU machine, where no
checkpoint can be loaded: this builds the 7B-shaped target with random bf16 weights
directly on the device (``tests/support/fullsize.py``, as ``bench_engine`` and
``bench_capacity`` do in-process) and serves it exactly as ``eventspec-cloud serve``
would, every serve flag included. ``--size tiny`` serves the tiny random target, which
is how CPU tests rehearse it. Both use the tiny test tokenizer, so pair them with an
edge started with ``--model tiny-random``.

    python -m benchmarks.serve_random --size full --device cuda -- \\
        --port 0 --port-file /tmp/cloud.port --max-sessions 70

Everything after ``--`` goes to ``eventspec-cloud serve`` (its ``--model`` is ignored:
the random target stands in). ``--node edge`` serves ``eventspec-edge serve`` the same way
over the EventGPT-7B-shaped random drafter (``--size full``; its ``--model`` is ignored)
with a random feature adapter to Video-LLaVA-7B's video geometry, for the aligned path:

    python -m benchmarks.serve_random --node edge --size full --device cuda -- \\
        --port 0 --cloud 127.0.0.1:50061 --device cuda --draft-quant int4

Benchmarks only: the answers of random weights are noise.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence

import torch

from eventspec.cloud import cli as cloud_cli
from eventspec.cloud.config import CloudSettings
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.edge import cli as edge_cli
from eventspec.edge.config import EdgeSettings
from eventspec.shared.node.node_cli import NodeServer, serve
from tests.support.fullsize import build_full_target

#: Video-LLaVA-7B's video geometry (frames, tokens per frame with CLS, the tower's
#: selected layer): what the full-size edge's random adapter maps into.
FULL_VIDEO_GEOMETRY = (8, 257, 1024)

PROG = "serve_random"
log = logging.getLogger("eventspec.benchmarks.serve_random")


def random_target(size: str, device: str, seed: int) -> TargetModel:
    """The full-size (7B-shaped, bf16 on ``device``) or tiny random target."""
    if size == "full":
        return build_full_target(device)
    target = build_tiny_random_target(seed)
    if device != "cpu":
        target.model.to(device)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, serve_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) \
        if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{PROG}",
                                     description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--node", choices=["cloud", "edge"], default="cloud")
    parser.add_argument("--size", choices=["full", "tiny"], default="full")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--video-geometry", type=_geometry, default=FULL_VIDEO_GEOMETRY,
                        help="edge: the cloud's video geometry F,T,D (GetServerInfo), "
                             "which the random adapter maps into")
    mine = parser.parse_args(ours)
    if mine.node == "edge":
        return serve_edge(mine, serve_args)
    args = cloud_cli.build_parser().parse_args(["serve", *serve_args])
    settings: CloudSettings = dataclasses.replace(cloud_cli.settings_from_args(args),
                                                  device=mine.device)
    target = random_target(mine.size, mine.device, mine.seed)
    log.warning("serving a RANDOM %s target (%s) on %s: benchmarks only", mine.size,
                target.model_id, mine.device)

    def server(s: CloudSettings) -> NodeServer:
        return VerifierServer(s, target=target)

    return serve(PROG, args, log, settings, server)


def serve_edge(mine: argparse.Namespace, serve_args: Sequence[str]) -> int:
    """``eventspec-edge serve`` over the random drafter of ``--size`` (EventGPT-7B-shaped
    in bf16, or the tiny one in fp32) and a random feature adapter into the cloud's
    ``--video-geometry``, for the aligned path."""
    from eventspec.edge.drafting.eventgpt import N_EVENT_FRAMES, clip_config_of, image_size_of
    from eventspec.edge.server import EdgeServer
    from eventspec.edge.vision.align import build_adapter_for

    args = edge_cli.build_parser().parse_args(["serve", *serve_args])
    settings: EdgeSettings = dataclasses.replace(edge_cli.settings_from_args(args),
                                                 device=mine.device)
    if mine.size == "full":
        from tests.support.fullsize import build_full_draft

        draft = build_full_draft(mine.device)
        dtype = torch.bfloat16
    else:
        from eventspec.demoworld.tiny_draft import build_tiny_random_draft

        draft = build_tiny_random_draft(mine.seed, device=mine.device)
        dtype = torch.float32
    clip = clip_config_of(draft.model.config)
    patches = (image_size_of(clip) // int(clip.patch_size)) ** 2
    adapter = build_adapter_for((N_EVENT_FRAMES, 1 + patches, int(clip.hidden_size)),
                                mine.video_geometry, seed=mine.seed)
    adapter = adapter.to(device=mine.device, dtype=dtype)
    log.warning("serving a RANDOM %s drafter (%s) on %s: benchmarks only", mine.size,
                draft.model_id, mine.device)

    def server(s: EdgeSettings) -> NodeServer:
        return EdgeServer(s, draft=draft, adapter=adapter)

    return serve(PROG, args, log, settings, server)


def _geometry(text: str) -> tuple[int, int, int]:
    """``--video-geometry F,T,D``."""
    try:
        frames, tokens, dim = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected F,T,D (three integers), got {text!r}") \
            from None
    return frames, tokens, dim


if __name__ == "__main__":
    sys.exit(main())
