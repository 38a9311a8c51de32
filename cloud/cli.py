"""``eventspec-cloud``: run the Video-LLaVA verifier."""

from __future__ import annotations

import argparse
import logging
import sys

from eventspec.cloud.config import ENV_PREFIX, CloudSettings
from eventspec.cloud.model_dirs import TINY_RANDOM, TOY
from eventspec.shared.helpfmt import DefaultsHelpFormatter
from eventspec.shared.node.node_cli import (
    add_serve_flags,
    builtin_model,
    checked,
    env_defaults,
    refuse_missing_directories,
    serve,
)
from eventspec.shared.node.serving import NodeServer
from eventspec.shared.node.settings_fields import settings_from_args as settings_from_flags
from eventspec.shared.wire.flags import server_security_from_args

PROG = "eventspec-cloud"

log = logging.getLogger("eventspec.cloud")


def build_parser() -> argparse.ArgumentParser:
    """The ``eventspec-cloud`` parser; ``--help`` shows every default and its variable
    (each flag is declared once, on its ``CloudSettings`` field)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cmd = sub.add_parser("serve", help="serve eventspec.v1.Verifier over gRPC",
                               formatter_class=DefaultsHelpFormatter)
    add_serve_flags(serve_cmd, env_defaults(PROG, ENV_PREFIX, CloudSettings.from_env),
                    ENV_PREFIX, "the cloud verifier")
    return parser


def settings_from_args(args: argparse.Namespace) -> CloudSettings:
    """The settings the flags describe, checked; a bad value exits with one line."""
    return checked(PROG, settings_from_flags(
        CloudSettings, args, security=server_security_from_args(args, ENV_PREFIX)))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    refuse_missing_directories(PROG, {"--model": settings.model},
                               {"--model": (TOY, TINY_RANDOM)})
    return serve(PROG, args, log, settings, _server,
                 scratch_model=(builtin_model(PROG, "cloud", TINY_RANDOM)
                                if settings.model == TINY_RANDOM else None))


def _server(settings: CloudSettings) -> NodeServer:
    from eventspec.cloud.server import VerifierServer

    return VerifierServer(settings)


if __name__ == "__main__":
    sys.exit(main())
