"""``eventspec-edge``: run the edge agent beside an event camera."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from eventspec.edge.config import EdgeSettings, SettingsError
from eventspec.edge.model_dirs import TINY_RANDOM
from eventspec.shared.helpfmt import DefaultsHelpFormatter
from eventspec.shared.node.serving import (
    LOG_FORMAT,
    MODEL_DTYPES,
    add_metrics_args,
    quiet_progress_bars,
    run_node,
)
from eventspec.shared.wire.flags import (
    add_client_security_args,
    add_health_port_arg,
    add_server_security_args,
    client_security_from_args,
    server_security_from_args,
)

#: Exit status of a refused flag or environment value, as argparse's own.
EXIT_USAGE = 2


def _refuse(message: str) -> NoReturn:
    """One line on stderr naming the flag or variable, then exit 2 (nothing started)."""
    print(f"eventspec-edge: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


log = logging.getLogger("eventspec.edge")


#: ``--log-level`` names (``logging`` refuses others with a traceback).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def build_parser() -> argparse.ArgumentParser:
    """The ``eventspec-edge`` parser; ``--help`` shows every default and its variable."""
    try:
        env = EdgeSettings.from_env()
    except SettingsError as exc:
        _refuse(str(exc))
    parser = argparse.ArgumentParser(prog="eventspec-edge", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve eventspec.v1.EdgeAgent over gRPC",
                           formatter_class=DefaultsHelpFormatter)
    serve.add_argument("--cloud", default=env.cloud,
                       help="the cloud verifier: HOST:PORT, dns:///NAME:PORT (every replica "
                            "the name resolves to) or IP:PORT,IP:PORT,... (replicas, balanced "
                            "round_robin with health checks); omit for draft_only "
                            "($EVENTSPEC_EDGE_CLOUD)")
    serve.add_argument("--source", default=env.source,
                       help="PATH (format detected from its header/extension) | KIND:PATH with "
                            "KIND aedat4, raw, evt2, evt3, dat, bin, txt, dsec, npy, npz | "
                            "dv-net:HOST:PORT | dv-camera[:SERIAL] | prophesee-camera[:SERIAL] "
                            "| toy[:SEED|:A-B] (A-B: scenes A..B-1) | synthetic[:SEED]; "
                            "see docs/input-formats.md ($EVENTSPEC_EDGE_SOURCE)")
    serve.add_argument("--sensor-size", default=None, metavar="WxH",
                       help="sensor size for files that do not state it (e.g. 640x480); a "
                            "size in the file's header wins")
    serve.add_argument("--allow-pickle", action="store_true",
                       help="allow EventGPT's pickled .npy files (loading a pickle runs code "
                            "from the file: only for files you trust)")
    serve.add_argument("--model", default=env.model,
                       help="a local EventGPT-7b directory, toy (the embedded toy-world "
                            "model, with its adapter) or tiny-random ($EVENTSPEC_EDGE_MODEL)")
    serve.add_argument("--adapter", type=Path, default=None,
                       help="feature adapter directory, or toy (enables the aligned "
                            "feature mode)")
    serve.add_argument("--host", default=env.host,
                       help="bind address ($EVENTSPEC_EDGE_HOST)")
    serve.add_argument("--port", type=int, default=env.port,
                       help="port, 1..65535; 0 picks a free one ($EVENTSPEC_EDGE_PORT)")
    serve.add_argument("--device", default=env.device,
                       help="cpu, cuda or cuda:N ($EVENTSPEC_EDGE_DEVICE)")
    serve.add_argument("--dtype", default="float32", choices=list(MODEL_DTYPES),
                       help="the draft model's weights")
    serve.add_argument("--jpeg-quality", type=int, default=90,
                       help="JPEG quality of frames sent to the cloud, 1..100")
    serve.add_argument("--request-timeout", type=float, default=120.0,
                       help="deadline of one request's stream to the cloud, seconds")
    serve.add_argument("--cloud-wait-s", type=float, default=env.cloud_wait_s,
                       help="how long an Ask waits for a cloud verifier that is warming up "
                            "or briefly unreachable, streaming progress, before it fails "
                            "(never past the Ask's deadline) ($EVENTSPEC_EDGE_CLOUD_WAIT_S)")
    serve.add_argument("--cloud-first-reply-s", type=float, default=env.cloud_first_reply_s,
                       help="a cloud replica that sends no Plan this long after a request's "
                            "Open is taken for hung, and the request moves to another "
                            "replica if nothing was committed "
                            "($EVENTSPEC_EDGE_CLOUD_FIRST_REPLY_S)")
    serve.add_argument("--max-queued-asks", type=int, default=env.max_queued_asks,
                       help="Asks that may wait in line for a cloud slot (the edge keeps to "
                            "the sessions its cloud advertises); more are refused with "
                            "RESOURCE_EXHAUSTED ($EVENTSPEC_EDGE_MAX_QUEUED_ASKS)")
    serve.add_argument("--speculation", choices=["auto", "always"], default="auto",
                       help="auto: draft when the timing plan says it pays (default); "
                            "always: draft regardless, e.g. to measure acceptance")
    serve.add_argument("--port-file", type=Path, default=None,
                       help="write the bound port here as soon as it is bound (for --port "
                            "0; the edge is NOT_SERVING until warm: wait with eventspec wait)")
    serve.add_argument("--log-level", default="INFO", choices=LOG_LEVELS,
                       type=str.upper, help="log threshold")
    add_health_port_arg(serve, "EVENTSPEC_EDGE_")
    add_metrics_args(serve)
    add_server_security_args(serve, "EVENTSPEC_EDGE_")
    add_client_security_args(serve, prefix="cloud-", env_prefix="EVENTSPEC_EDGE_CLOUD_",
                             peer="cloud verifier")
    return parser


def settings_from_args(args: argparse.Namespace) -> EdgeSettings:
    """The settings the flags describe, checked; a bad value exits with one line."""
    settings = replace(
        EdgeSettings(),
        cloud=args.cloud,
        source=args.source,
        allow_pickle=args.allow_pickle,
        sensor_size=_sensor_size(args.sensor_size),
        model=args.model,
        adapter=args.adapter,
        host=args.host,
        port=args.port,
        health_port=args.health_port,
        device=args.device,
        dtype=args.dtype,
        default_jpeg_quality=args.jpeg_quality,
        request_timeout_s=args.request_timeout,
        cloud_wait_s=args.cloud_wait_s,
        cloud_first_reply_s=args.cloud_first_reply_s,
        max_queued_asks=args.max_queued_asks,
        speculation=args.speculation,
        security=server_security_from_args(args, "EVENTSPEC_EDGE_"),
        cloud_security=client_security_from_args(args, prefix="cloud-",
                                                 env_prefix="EVENTSPEC_EDGE_CLOUD_"),
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
    try:
        settings.check()
    except SettingsError as exc:
        _refuse(str(exc))
    return settings


def _sensor_size(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    from eventspec.edge.events.sources import parse_sensor_size
    from eventspec.shared.contract.errors import InvalidInput

    try:
        return parse_sensor_size(text)
    except InvalidInput as exc:
        _refuse(f"--sensor-size: {exc}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT)
    quiet_progress_bars()
    from eventspec.edge.server import EdgeServer

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
    from eventspec.demoworld.tiny_draft import TINY_DRAFT_ID, save_tiny_random_draft

    tmp = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="eventspec-edge-")))
    return save_tiny_random_draft(tmp / f"{TINY_DRAFT_ID}-{seed}", seed)


if __name__ == "__main__":
    sys.exit(main())
