"""``eventspec-cloud``: run the Video-LLaVA verifier."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

from eventspec.cloud.config import ENGINES, ENV_PREFIX, KV_LAYOUTS, VERIFY_WIDTHS, CloudSettings
from eventspec.cloud.model_dirs import TINY_RANDOM
from eventspec.cloud.session_capacity import parse_max_sessions
from eventspec.shared.helpfmt import DefaultsHelpFormatter
from eventspec.shared.node.node_cli import (
    add_metrics_args,
    add_run_args,
    add_setting,
    checked,
    env_defaults,
    serve,
)
from eventspec.shared.node.serving import MODEL_DTYPES, NodeServer
from eventspec.shared.wire.flags import (
    add_health_port_arg,
    add_server_security_args,
    server_security_from_args,
)

PROG = "eventspec-cloud"

log = logging.getLogger("eventspec.cloud")


def build_parser() -> argparse.ArgumentParser:
    """The ``eventspec-cloud`` parser; ``--help`` shows every default and its variable."""
    env = env_defaults(PROG, ENV_PREFIX, CloudSettings.from_env)
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cmd = sub.add_parser("serve", help="serve eventspec.v1.Verifier over gRPC",
                               formatter_class=DefaultsHelpFormatter)
    arg = partial(add_setting, serve_cmd, ENV_PREFIX)
    arg("--model", default=env.model,
        help="a local Video-LLaVA-7B-hf directory, toy (the embedded toy-world model) or "
             "tiny-random")
    arg("--host", default=env.host, help="bind address")
    arg("--port", type=int, default=env.port, help="port, 1..65535; 0 picks a free one")
    arg("--device", default=env.device, help="cpu, cuda or cuda:N")
    arg("--dtype", default=env.dtype, choices=list(MODEL_DTYPES), help="the model's weights")
    arg("--max-sessions", type=_sessions, default=env.limits.max_sessions,
        help="concurrent Generate streams; more get RESOURCE_EXHAUSTED. auto (0): as many "
             "as run at once (on a GPU what the KV holds at the default answer cap, at most "
             "64; on a CPU 8) plus --kv-queue waiting for KV")
    arg("--max-sessions-per-principal", type=int, default=env.max_sessions_per_principal,
        help="concurrent Generate streams one authenticated caller (token name or "
             "certificate) may hold; more get RESOURCE_EXHAUSTED. 0: all but one of "
             "--max-sessions, so one caller always leaves a slot free")
    arg("--max-new-tokens", type=int, default=env.limits.max_new_tokens,
        help="cap on a request's max_new_tokens (>= 1; a request's 0 means min(64, this "
             "cap))")
    arg("--kv-cache-gb", type=float, default=env.kv_cache_gb,
        help="KV memory budget in GiB: by length, an arena of budget / (KV bytes per "
             "token) positions less one --max-seq-len for padding; with slots, budget / "
             "(max-seq-len x KV bytes per token) slots, at most --max-sessions (default: "
             "--kv-memory-fraction of free GPU memory, or 2 GiB on CPU)")
    arg("--kv-layout", choices=list(KV_LAYOUTS), default=env.kv_layout,
        help="by-length: a request takes KV for its own prompt plus its answer cap, so "
             "short requests leave room for more (static engine); slots: every request "
             "a slot of --max-seq-len positions (the HF engine always)")
    arg("--kv-memory-fraction", type=float, default=env.kv_memory_fraction,
        help="without --kv-cache-gb, the share of free GPU memory the KV budget takes, "
             "in (0, 1]")
    arg("--max-seq-len", type=int, default=env.max_seq_len,
        help="positions per KV slot, prompt plus answer (default: the prompt's template "
             "and video rows, 256 question tokens and --max-new-tokens, at most the "
             "model's; a longer question gets a smaller answer cap, stated in its Plan)")
    arg("--engine", choices=list(ENGINES), default=env.engine,
        help="static: static KV slots + CUDA graphs; hf: the HF eager reference; auto: "
             "static on CUDA, hf on CPU; a model the static engine cannot serve falls "
             "back to hf, logged")
    arg("--max-verify-tokens", type=int, default=env.max_verify_tokens,
        help="widest verify step of one request: the last committed token plus up to "
             "this many minus one drafts (advertised to the edge, which drafts no "
             "further ahead)")
    arg("--verify-width", choices=list(VERIFY_WIDTHS), default=env.verify_width,
        help="auto: each step verifies, per session, the drafts that maximise the "
             "batch's expected tokens per ms under the cost model and the measured "
             "acceptance; all: every valid draft up to --max-verify-tokens")
    arg("--prefill-chunk", default=env.prefill_chunk,
        help="chunked prefill, decode first (static engine): off (whole prompts), auto "
             "(each iteration prefills about one step's worth of prompt tokens, from the "
             "cost model, at least 1,024) or a number of tokens per iteration; on a GPU a "
             "number gets CUDA graphs of the step with its chunks (auto runs them eagerly); "
             "with --batch-invariant the chunks run in calls of their own, and off is faster")
    arg("--prefix-cache-gb", type=float, default=env.prefix_cache_gb,
        help="GiB of device memory for saved prompt prefixes, taken out of the KV budget: "
             "a question about a clip already asked about skips the video prefill "
             "(static engine; 0: off)")
    arg("--mixed-steps", choices=["on", "off"], default="on" if env.mixed_steps else "off",
        help="with --prefill-chunk, run the chunks inside the decoding sessions' step (one "
             "forward, static engine; not with --batch-invariant); off: a call of their own")
    arg("--batch-invariant", action="store_true", default=env.batch_invariant,
        help="batch-invariant arithmetic: a greedy answer's logits do not depend on who "
             "else is in the batch, so speculative equals target-only at any load "
             "(static engine; on CUDA, batch-invariant Triton kernels with CUDA graphs)")
    arg("--gil-switch-interval-ms", type=float, default=env.gil_switch_interval_ms,
        help="the interpreter's thread switch interval while serving (0: Python's 5 ms); "
             "the engine thread waits up to this long for the GIL after each torch call "
             "while gRPC work holds it")
    arg("--gc-freeze", choices=["on", "off"], default="on" if env.gc_freeze else "off",
        help="once warm, freeze the garbage collector's view of the heap (gc.freeze), so "
             "its full passes skip the model and the engine instead of pausing the loop")
    arg("--kv-queue", type=int, default=env.kv_queue,
        help="requests that may wait, first come first served, for a KV slot when all "
             "are taken (0: refuse at once with RESOURCE_EXHAUSTED)")
    arg("--kv-wait-s", type=float, default=env.kv_wait_s,
        help="the longest a request waits in that queue; its own deadline may end the "
             "wait sooner (RESOURCE_EXHAUSTED then says so)")
    arg("--profile", type=Path, default=env.profile_path,
        help="calibration profile file: reused at the next start when it matches the "
             "model and device, which skips calibration (default: "
             "~/.cache/eventspec/...)")
    arg("--recalibrate", action="store_true", default=env.recalibrate,
        help="measure the cost model afresh even if a saved profile matches")
    arg("--emulate-prefill-ms", type=float, default=env.emulate_prefill_ms,
        help="pace each prefill to at least this long, to rehearse a slower cloud (e.g. "
             "200); output is unchanged")
    arg("--emulate-step-ms", type=float, default=env.emulate_step_ms,
        help="pace each decode/verify step to at least this long (e.g. 30, an "
             "A100-class 7B step)")
    arg("--session-ttl-s", type=float, default=env.session_ttl_s,
        help="a session older than this is released (a leak guard; longer than any "
             "request should take)")
    arg("--first-message-timeout-s", type=float, default=env.first_message_timeout_s,
        help="a Generate call that sends no Open this long after it starts ends with "
             "DEADLINE_EXCEEDED")
    arg("--features-base-timeout-s", type=float, default=env.features_base_timeout_s,
        help="aligned features must arrive within this plus the time their declared "
             "size takes over the edge's measured uplink (4x slack), and within "
             "--input-timeout-s of Open")
    arg("--input-timeout-s", type=float, default=env.input_timeout_s,
        help="no aligned-features upload may take longer than this after Open, whatever "
             "it declares")
    arg("--drain-timeout-s", type=float, default=env.drain_timeout_s,
        help="after Done, how long to wait for the edge to close its side of the stream")
    arg("--grace-s", type=float, default=env.grace_s,
        help="on SIGTERM, how long requests in flight may finish before they are "
             "cancelled")
    arg("--seed", type=int, default=env.seed,
        help="seed of --model tiny-random's random weights")
    add_run_args(serve_cmd, "the cloud verifier")
    add_health_port_arg(serve_cmd, ENV_PREFIX, env.health_port)
    add_metrics_args(serve_cmd, ENV_PREFIX, port=env.metrics_port, host=env.metrics_host,
                     principals=env.metrics_principals)
    add_server_security_args(serve_cmd, ENV_PREFIX)
    return parser


def _sessions(text: str) -> int:
    """``--max-sessions``: auto or an integer (argparse reports a ValueError's type)."""
    try:
        return parse_max_sessions(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def settings_from_args(args: argparse.Namespace) -> CloudSettings:
    """The settings the flags describe, checked; a bad value exits with one line."""
    defaults = CloudSettings()
    return checked(PROG, replace(
        defaults,
        model=args.model,
        host=args.host,
        port=args.port,
        health_port=args.health_port,
        device=args.device,
        dtype=args.dtype,
        limits=replace(defaults.limits, max_sessions=args.max_sessions,
                       max_new_tokens=args.max_new_tokens),
        max_sessions_per_principal=args.max_sessions_per_principal,
        kv_cache_gb=args.kv_cache_gb,
        kv_memory_fraction=args.kv_memory_fraction,
        max_seq_len=args.max_seq_len,
        kv_layout=args.kv_layout,
        engine=args.engine,
        max_verify_tokens=args.max_verify_tokens,
        verify_width=args.verify_width,
        prefill_chunk=args.prefill_chunk,
        prefix_cache_gb=args.prefix_cache_gb,
        batch_invariant=args.batch_invariant,
        mixed_steps=args.mixed_steps == "on",
        gc_freeze=args.gc_freeze == "on",
        gil_switch_interval_ms=args.gil_switch_interval_ms,
        kv_queue=args.kv_queue,
        kv_wait_s=args.kv_wait_s,
        profile_path=args.profile,
        recalibrate=args.recalibrate,
        emulate_prefill_ms=args.emulate_prefill_ms,
        emulate_step_ms=args.emulate_step_ms,
        session_ttl_s=args.session_ttl_s,
        first_message_timeout_s=args.first_message_timeout_s,
        features_base_timeout_s=args.features_base_timeout_s,
        input_timeout_s=args.input_timeout_s,
        drain_timeout_s=args.drain_timeout_s,
        grace_s=args.grace_s,
        seed=args.seed,
        security=server_security_from_args(args, ENV_PREFIX),
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        metrics_principals=args.metrics_principals,
    ))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    return serve(PROG, args, log, settings, _server,
                 scratch_model=_tiny_random_target if settings.model == TINY_RANDOM else None)


def _server(settings: CloudSettings) -> NodeServer:
    from eventspec.cloud.server import VerifierServer

    return VerifierServer(settings)


def _tiny_random_target(scratch: Path, seed: int) -> Path:
    """``--model tiny-random``: the demo world writes its tiny random target into the
    scratch directory, which the server loads like any other.

    The cloud's only import of the demo world, here at the command's edge and lazy, so
    the server itself knows nothing but model directories.
    """
    from eventspec.demoworld.tiny_target import TINY_TARGET_ID, save_tiny_random_target

    return save_tiny_random_target(scratch / TINY_TARGET_ID, seed)


if __name__ == "__main__":
    sys.exit(main())
