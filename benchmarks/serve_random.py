"""A cloud verifier process over a random target of a given size, for benchmarks.

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
the random target stands in). Benchmarks only: the answers of random weights are noise.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence

import torch

from eventspec.cloud.cli import build_parser, settings_from_args
from eventspec.cloud.config import CloudSettings
from eventspec.cloud.server import VerifierServer
from eventspec.cloud.target import TargetModel
from eventspec.demoworld.tiny_target import build_tiny_random_target
from eventspec.shared.node.node_cli import NodeServer, serve
from tests.support.fullsize import build_full_target

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
    parser.add_argument("--size", choices=["full", "tiny"], default="full")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    mine = parser.parse_args(ours)
    args = build_parser().parse_args(["serve", *serve_args])
    settings: CloudSettings = dataclasses.replace(settings_from_args(args),
                                                  device=mine.device)
    target = random_target(mine.size, mine.device, mine.seed)
    log.warning("serving a RANDOM %s target (%s) on %s: benchmarks only", mine.size,
                target.model_id, mine.device)

    def server(s: CloudSettings) -> NodeServer:
        return VerifierServer(s, target=target)

    return serve(PROG, args, log, settings, server)


if __name__ == "__main__":
    sys.exit(main())
