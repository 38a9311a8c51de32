"""``eventspec-edge``: run the edge agent beside an event camera."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from edge.config import EdgeSettings
from edge.model_dirs import TINY_RANDOM
from shared.serving import LOG_FORMAT, MODEL_DTYPES, run_node
from shared.wire.flags import (
    add_client_security_args,
    add_server_security_args,
    client_security_from_args,
    server_security_from_args,
)

log = logging.getLogger("eventspec.edge")


def build_parser() -> argparse.ArgumentParser:
    env = EdgeSettings.from_env()
    parser = argparse.ArgumentParser(prog="eventspec-edge", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve eventspec.v1.EdgeAgent over gRPC")
    serve.add_argument("--cloud", default=env.cloud,
                       help="the cloud verifier: HOST:PORT, dns:///NAME:PORT (every replica "
                            "the name resolves to) or IP:PORT,IP:PORT,... (replicas, balanced "
                            "round_robin with health checks); omit for draft_only")
    serve.add_argument("--source", default=env.source,
                       help="PATH (format detected from its header/extension) | KIND:PATH with "
                            "KIND aedat4, raw, evt2, evt3, dat, bin, txt, dsec, npy, npz | "
                            "dv-net:HOST:PORT | dv-camera[:SERIAL] | prophesee-camera[:SERIAL] "
                            "| toy[:SEED|:A-B] | synthetic[:SEED] (default: %(default)s); "
                            "see docs/input-formats.md")
    serve.add_argument("--sensor-size", default=None, metavar="WxH",
                       help="sensor size for files that do not state it (e.g. 640x480); a "
                            "size in the file's header wins")
    serve.add_argument("--allow-pickle", action="store_true",
                       help="allow EventGPT's pickled .npy files (loading a pickle runs code "
                            "from the file: only for files you trust)")
    serve.add_argument("--model", default=env.model,
                       help="a local EventGPT-7b directory, toy (the embedded toy-world "
                            "model, with its adapter) or tiny-random (default: %(default)s)")
    serve.add_argument("--adapter", type=Path, default=None,
                       help="feature adapter directory, or toy (enables the aligned "
                            "feature mode)")
    serve.add_argument("--host", default=env.host)
    serve.add_argument("--port", type=int, default=env.port, help="port; 0 picks a free one")
    serve.add_argument("--device", default=env.device, help="cpu, cuda or cuda:N")
    serve.add_argument("--dtype", default="float32",
                       choices=list(MODEL_DTYPES))
    serve.add_argument("--jpeg-quality", type=int, default=90)
    serve.add_argument("--request-timeout", type=float, default=120.0,
                       help="deadline of one request's stream to the cloud, seconds")
    serve.add_argument("--speculation", choices=["auto", "always"], default="auto",
                       help="auto: draft when the timing plan says it pays (default); "
                            "always: draft regardless, e.g. to measure acceptance")
    serve.add_argument("--port-file", type=Path, default=None,
                       help="write the bound port here once SERVING (for --port 0)")
    serve.add_argument("--log-level", default="INFO")
    add_server_security_args(serve, "EVENTSPEC_EDGE_")
    add_client_security_args(serve, prefix="cloud-", env_prefix="EVENTSPEC_EDGE_CLOUD_",
                             peer="cloud verifier")
    return parser


def settings_from_args(args: argparse.Namespace) -> EdgeSettings:
    if not 1 <= args.jpeg_quality <= 100:
        raise SystemExit("--jpeg-quality must be in 1..100")
    return replace(
        EdgeSettings(),
        cloud=args.cloud,
        source=args.source,
        allow_pickle=args.allow_pickle,
        sensor_size=_sensor_size(args.sensor_size),
        model=args.model,
        adapter=args.adapter,
        host=args.host,
        port=args.port,
        device=args.device,
        dtype=args.dtype,
        default_jpeg_quality=args.jpeg_quality,
        request_timeout_s=args.request_timeout,
        speculation=args.speculation,
        security=server_security_from_args(args, "EVENTSPEC_EDGE_"),
        cloud_security=client_security_from_args(args, prefix="cloud-",
                                                 env_prefix="EVENTSPEC_EDGE_CLOUD_"),
    )


def _sensor_size(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    from edge.events.sources import parse_sensor_size
    from shared.errors import InvalidInput

    try:
        return parse_sensor_size(text)
    except InvalidInput as exc:
        raise SystemExit(f"--sensor-size: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    settings = settings_from_args(args)
    from edge.server import EdgeServer

    with contextlib.ExitStack() as scratch:
        if settings.model == TINY_RANDOM:
            settings = replace(settings, model=str(_tiny_random_dir(scratch, settings.seed)))
        return run_node(EdgeServer(settings), args.port_file, log, settings.grace_s,
                        "eventspec-edge")


def _tiny_random_dir(scratch: contextlib.ExitStack, seed: int) -> Path:
    """``--model tiny-random``: the demo world writes its tiny random draft to a
    temporary directory (removed on exit), which the server loads like any other.

    The edge's only import of the demo world, here at the command's edge and lazy, so
    the server itself knows nothing but model directories.
    """
    from shared.demoworld.tiny_draft import TINY_DRAFT_ID, save_tiny_random_draft

    tmp = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="eventspec-edge-")))
    return save_tiny_random_draft(tmp / f"{TINY_DRAFT_ID}-{seed}", seed)


if __name__ == "__main__":
    sys.exit(main())
