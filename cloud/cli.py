"""``eventspec-cloud``: run the Video-LLaVA verifier."""

from __future__ import annotations

import argparse
import logging
import sys

from eventspec.cloud.config import ENV_PREFIX, CloudSettings
from eventspec.cloud.model_dirs import BUILTIN_MODELS, TINY_RANDOM
from eventspec.shared.node.node_cli import (
    add_serve_command,
    builtin_model,
    refuse_missing_directories,
    serve,
    serve_settings,
)
from eventspec.shared.node.serving import NodeServer

PROG = "eventspec-cloud"

log = logging.getLogger("eventspec.cloud")


def build_parser() -> argparse.ArgumentParser:
    """The ``eventspec-cloud`` parser; ``--help`` shows every default and its variable
    (each flag is declared once, on its ``CloudSettings`` field)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    add_serve_command(parser.add_subparsers(dest="command", required=True), PROG,
                      CloudSettings.from_env, ENV_PREFIX,
                      help="serve eventspec.v1.Verifier over gRPC", node="the cloud verifier")
    return parser


def settings_from_args(args: argparse.Namespace) -> CloudSettings:
    """The settings the flags describe, checked; a bad value exits with one line."""
    return serve_settings(PROG, CloudSettings, args, ENV_PREFIX)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    refuse_missing_directories(PROG, {"--model": settings.model},
                               {"--model": BUILTIN_MODELS})
    return serve(PROG, args, log, settings, _server,
                 scratch_model=(builtin_model(PROG, "cloud", TINY_RANDOM)
                                if settings.model == TINY_RANDOM else None))


def _server(settings: CloudSettings) -> NodeServer:
    from eventspec.cloud.server import VerifierServer

    return VerifierServer(settings)


if __name__ == "__main__":
    sys.exit(main())
