"""``eventspec-edge``: run the edge agent beside an event camera."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from eventspec.edge.config import ENV_PREFIX, EdgeSettings
from eventspec.edge.model_dirs import BUILTIN_MODELS, TINY_RANDOM, TOY
from eventspec.shared.helpfmt import DefaultsHelpFormatter
from eventspec.shared.node.node_cli import (
    add_serve_command,
    builtin_model,
    refuse,
    refuse_missing_directories,
    serve,
    serve_settings,
)
from eventspec.shared.node.serving import NodeServer
from eventspec.shared.wire.flags import add_client_security_args, client_security_from_args

PROG = "eventspec-edge"

log = logging.getLogger("eventspec.edge")


def build_parser() -> argparse.ArgumentParser:
    """The ``eventspec-edge`` parser; ``--help`` shows every default and its variable
    (each ``serve`` setting's flag is declared once, on its ``EdgeSettings`` field)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cmd = add_serve_command(sub, PROG, EdgeSettings.from_env, ENV_PREFIX,
                                  help="serve eventspec.v1.EdgeAgent over gRPC", node="the edge")
    add_client_security_args(serve_cmd, prefix="cloud-", env_prefix=f"{ENV_PREFIX}CLOUD_",
                             peer="cloud verifier")
    add_export_onnx_parser(sub)
    add_train_adapter_parser(sub)
    return parser


def add_export_onnx_parser(sub: Any) -> None:
    """``export-onnx``: the vision path as ONNX graphs, for ``serve --vision-backend onnx``."""
    export = sub.add_parser(
        "export-onnx", formatter_class=DefaultsHelpFormatter,
        help="export the vision path (CLIP, projector, feature adaptor, and the adapter) "
             "to ONNX for --vision-backend onnx")
    export.add_argument("--model", required=True,
                        help="the EventGPT checkpoint directory the edge serves, or toy "
                             "(which brings its adapter)")
    export.add_argument("--adapter", type=Path, default=None,
                        help="feature adapter directory to export too (toy: the toy one)")
    export.add_argument("--out", type=Path, required=True,
                        help="directory for the graphs and export.json (created; an old "
                             "export there is replaced)")
    export.add_argument("--opset", type=int, default=17, help="ONNX opset, 17..20")
    export.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log threshold")


def add_train_adapter_parser(sub: Any) -> None:
    """``train-adapter``: a token adapter or draft head from a ``--commit-log`` directory."""
    from eventspec.edge.learning.train_settings import HeadTraining

    d = HeadTraining()
    tr = sub.add_parser(
        "train-adapter", formatter_class=DefaultsHelpFormatter,
        help="train a token adapter or draft head (for serve --draft-head) from a commit "
             "log (serve --commit-log), offline")
    tr.add_argument("--log", type=Path, required=True, help="the commit log directory")
    tr.add_argument("--out", type=Path, required=True,
                    help="the new model directory (must not exist or be empty)")
    tr.add_argument("--kind", choices=["adapter", "head"], default=d.kind,
                    help="adapter: an MLP on the drafter's hidden state; head: EAGLE-style, "
                         "hidden state plus the committed tokens through one attention layer")
    tr.add_argument("--steps", type=int, default=d.steps, help="optimiser steps")
    tr.add_argument("--batch", type=int, default=d.batch, help="requests per step")
    tr.add_argument("--hidden", type=int, default=d.hidden, help="the network's width")
    tr.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    tr.add_argument("--holdout", type=float, default=d.holdout,
                    help="share of requests held out to report top-1 agreement")
    tr.add_argument("--seed", type=int, default=d.seed, help="initialisation and order")


def train_adapter_command(args: argparse.Namespace) -> int:
    """``train-adapter``: train, write the directory, print its metrics as JSON."""
    import json

    from eventspec.edge.learning.train import train_from_log
    from eventspec.edge.learning.train_settings import HeadTraining
    from eventspec.shared.contract.errors import EventSpecError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        metrics = train_from_log(args.log, args.out, HeadTraining(
            kind=args.kind, steps=args.steps, batch=args.batch, hidden=args.hidden,
            lr=args.lr, holdout=args.holdout, seed=args.seed))
    except (EventSpecError, OSError) as exc:
        print(f"{PROG} train-adapter: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(metrics, indent=2))
    print(f"serve it with --draft-head {args.out}", file=sys.stderr)
    return 0


def settings_from_args(args: argparse.Namespace) -> EdgeSettings:
    """The settings the flags describe, checked; a bad value exits with one line."""
    return serve_settings(PROG, EdgeSettings, args, ENV_PREFIX,
                          cloud_security=client_security_from_args(
                              args, prefix="cloud-", env_prefix=f"{ENV_PREFIX}CLOUD_"))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "export-onnx":
        return export_onnx_command(args)
    if args.command == "train-adapter":
        return train_adapter_command(args)
    settings = settings_from_args(args)
    refuse_missing_directories(PROG, {
        "--model": settings.model, "--adapter": settings.adapter,
        "--draft-head": settings.draft_head,
        "--onnx-dir": settings.onnx_dir if settings.vision_backend == "onnx" else None,
    }, {"--model": BUILTIN_MODELS, "--adapter": (TOY,)})
    _check_source(settings)
    return serve(PROG, args, log, settings, _server,
                 scratch_model=(builtin_model(PROG, "edge", TINY_RANDOM)
                                if settings.model == TINY_RANDOM else None))


def _check_source(settings: EdgeSettings) -> None:
    """Refuse a ``--source`` that cannot open (missing file, unknown kind, a content that
    contradicts its kind, a pickle without --allow-pickle, a file declaring more than
    --max-source-events/-bytes): exit 2 in a fraction of a second, before torch is
    imported and the port bound (edge/events/source_check.py)."""
    from eventspec.edge.events.limits import SourceLimits
    from eventspec.edge.events.source_check import check_source_spec
    from eventspec.shared.contract.errors import EventSpecError

    try:
        check_source_spec(settings.source, allow_pickle=settings.allow_pickle,
                          limits=SourceLimits(settings.max_source_events,
                                              settings.max_source_bytes))
    except EventSpecError as exc:
        refuse(PROG, f"--source: {exc}")


def export_onnx_command(args: argparse.Namespace) -> int:
    """``export-onnx``: write the export, print where and how close it came to torch."""
    from eventspec.edge.model_dirs import adapter_dir, draft_dir
    from eventspec.shared.contract.errors import EventSpecError

    try:
        from eventspec.edge.vision.onnx_export import export_onnx
    except ImportError as exc:
        refuse(PROG, f"export-onnx needs onnx and ONNX Runtime ({exc}): install "
                     "eventspec[edge-onnx] (CPU) or eventspec[edge-gpu] (CUDA)")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    if not 17 <= args.opset <= 20:
        refuse(PROG, f"--opset must be in 17..20, got {args.opset}")
    adapter = args.adapter if args.adapter is not None else (
        Path(TOY) if args.model == TOY else None)
    try:
        result = export_onnx(draft_dir(args.model),
                             adapter_dir(adapter) if adapter is not None else None,
                             args.out, opset=args.opset)
    except (EventSpecError, OSError) as exc:
        print(f"{PROG} export-onnx: {exc}", file=sys.stderr)
        return 1
    diffs = ", ".join(f"{k} {v:.1e}" for k, v in result.max_abs_diff.items())
    print(f"exported to {result.out} in {result.seconds:.1f} s (max |onnx - torch|, fp32 "
          f"on CPU: {diffs}); serve it with --vision-backend onnx --onnx-dir {result.out}")
    return 0


def _server(settings: EdgeSettings) -> NodeServer:
    from eventspec.edge.server import EdgeServer

    return EdgeServer(settings)


if __name__ == "__main__":
    sys.exit(main())
