"""``eventspec-cloud``: run the Video-LLaVA verifier."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from eventspec.cloud.config import CloudSettings, SettingsError
from eventspec.cloud.model_dirs import TINY_RANDOM
from eventspec.shared.contract.types import ServerLimits
from eventspec.shared.helpfmt import DefaultsHelpFormatter
from eventspec.shared.node.serving import (
    LOG_FORMAT,
    MODEL_DTYPES,
    add_metrics_args,
    quiet_progress_bars,
    run_node,
)
from eventspec.shared.wire.flags import (
    add_health_port_arg,
    add_server_security_args,
    server_security_from_args,
)

#: Exit status of a refused flag or environment value, as argparse's own.
EXIT_USAGE = 2


def _refuse(message: str) -> NoReturn:
    """One line on stderr naming the flag or variable, then exit 2 (nothing started)."""
    print(f"eventspec-cloud: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


log = logging.getLogger("eventspec.cloud")


#: ``--log-level`` names (``logging`` refuses others with a traceback).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def build_parser() -> argparse.ArgumentParser:
    """The ``eventspec-cloud`` parser; ``--help`` shows every default and its variable."""
    try:
        env = CloudSettings.from_env()
    except SettingsError as exc:
        _refuse(str(exc))
    parser = argparse.ArgumentParser(prog="eventspec-cloud", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve eventspec.v1.Verifier over gRPC",
                           formatter_class=DefaultsHelpFormatter)
    serve.add_argument(
        "--model", default=env.model,
        help="a local Video-LLaVA-7B-hf directory, toy (the embedded toy-world model) or "
             "tiny-random ($EVENTSPEC_CLOUD_MODEL)",
    )
    serve.add_argument("--host", default=env.host,
                       help="bind address ($EVENTSPEC_CLOUD_HOST)")
    serve.add_argument("--port", type=int, default=env.port,
                       help="port, 1..65535; 0 picks a free one ($EVENTSPEC_CLOUD_PORT)")
    serve.add_argument("--device", default=env.device,
                       help="cpu, cuda or cuda:N ($EVENTSPEC_CLOUD_DEVICE)")
    serve.add_argument("--dtype", default=env.dtype, choices=list(MODEL_DTYPES),
                       help="the model's weights ($EVENTSPEC_CLOUD_DTYPE)")
    serve.add_argument("--max-sessions", type=int, default=ServerLimits().max_sessions,
                       help="concurrent Generate streams; more get RESOURCE_EXHAUSTED")
    serve.add_argument("--max-sessions-per-principal", type=int, default=0,
                       help="concurrent Generate streams one authenticated caller (token name "
                            "or certificate) may hold; more get RESOURCE_EXHAUSTED. 0: all but "
                            "one of --max-sessions, so one caller always leaves a slot free")
    serve.add_argument("--max-new-tokens", type=int, default=ServerLimits().max_new_tokens,
                       help="cap on a request's max_new_tokens (>= 1; a request's 0 means "
                            "min(64, this cap))")
    serve.add_argument("--kv-cache-gb", type=float, default=None,
                       help="KV memory budget in GiB; slots = budget / (max-seq-len x KV bytes "
                            "per token), at most --max-sessions (default: 90%% of free GPU "
                            "memory, or 2 GiB on CPU)")
    serve.add_argument("--max-seq-len", type=int, default=None,
                       help="positions per KV slot, prompt plus answer (default: the model's)")
    serve.add_argument("--engine", choices=["auto", "static", "hf"], default="auto",
                       help="static: static KV slots + CUDA graphs; hf: the HF eager reference; "
                            "auto: static on CUDA, hf on CPU; a model "
                            "the static engine cannot serve falls back to hf, logged")
    serve.add_argument("--profile", type=Path, default=None,
                       help="calibration profile file (default: ~/.cache/eventspec/...)")
    serve.add_argument("--recalibrate", action="store_true",
                       help="measure the cost model afresh even if a saved profile matches")
    serve.add_argument("--no-calibrate", action="store_true",
                       help="skip warm-up calibration and use a fixed cost model")
    serve.add_argument("--emulate-prefill-ms", type=float, default=0.0,
                       help="pace each prefill to at least this long, to rehearse a slower "
                            "cloud (e.g. 200); output is unchanged")
    serve.add_argument("--emulate-step-ms", type=float, default=0.0,
                       help="pace each decode/verify step to at least this long (e.g. 30, "
                            "an A100-class 7B step)")
    serve.add_argument("--port-file", type=Path, default=None,
                       help="write the bound port here as soon as it is bound (for --port "
                            "0; NOT_SERVING until warm: wait with eventspec wait)")
    serve.add_argument("--log-level", default="INFO", choices=LOG_LEVELS,
                       type=str.upper, help="log threshold")
    add_health_port_arg(serve, "EVENTSPEC_CLOUD_")
    add_metrics_args(serve)
    add_server_security_args(serve, "EVENTSPEC_CLOUD_")
    return parser


def settings_from_args(args: argparse.Namespace) -> CloudSettings:
    """The settings the flags describe, checked; a bad value exits with one line."""
    settings = replace(
        CloudSettings(),
        model=args.model,
        host=args.host,
        port=args.port,
        health_port=args.health_port,
        device=args.device,
        dtype=args.dtype,
        limits=replace(ServerLimits(), max_sessions=args.max_sessions,
                       max_new_tokens=args.max_new_tokens),
        max_sessions_per_principal=args.max_sessions_per_principal,
        kv_cache_gb=args.kv_cache_gb,
        engine=args.engine,
        recalibrate=args.recalibrate,
        max_seq_len=args.max_seq_len,
        profile_path=args.profile,
        calibrate=not args.no_calibrate,
        emulate_prefill_ms=args.emulate_prefill_ms,
        emulate_step_ms=args.emulate_step_ms,
        security=server_security_from_args(args, "EVENTSPEC_CLOUD_"),
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    )
    try:
        settings.check()
    except SettingsError as exc:
        _refuse(str(exc))
    return settings


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT)
    quiet_progress_bars()
    from eventspec.cloud.server import VerifierServer

    with contextlib.ExitStack() as scratch:
        if settings.model == TINY_RANDOM:
            settings = replace(settings, model=str(_tiny_random_dir(scratch, settings.seed)))
        return run_node(VerifierServer(settings), args.port_file, log, settings.grace_s,
                        "eventspec-cloud")


def _tiny_random_dir(scratch: contextlib.ExitStack, seed: int) -> Path:
    """``--model tiny-random``: the demo world writes its tiny random target to a
    temporary directory (removed on exit), which the server loads like any other.

    The cloud's only import of the demo world, here at the command's edge and lazy, so
    the server itself knows nothing but model directories.
    """
    from eventspec.demoworld.tiny_target import TINY_TARGET_ID, save_tiny_random_target

    tmp = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="eventspec-cloud-")))
    return save_tiny_random_target(tmp / TINY_TARGET_ID, seed)


if __name__ == "__main__":
    sys.exit(main())
