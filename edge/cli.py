"""``eventspec-edge``: run the edge agent beside an event camera."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from eventspec.edge.config import (
    DRAFT_ENGINES,
    DRAFT_QUANTS,
    ENV_PREFIX,
    MAX_MESSAGE_BYTES,
    MIN_MESSAGE_BYTES,
    SPECULATION_MODES,
    VISION_BACKENDS,
    EdgeSettings,
)
from eventspec.edge.model_dirs import TINY_RANDOM, TOY
from eventspec.shared.helpfmt import DefaultsHelpFormatter
from eventspec.shared.node.node_cli import (
    add_metrics_args,
    add_run_args,
    add_setting,
    checked,
    env_defaults,
    refuse,
    serve,
)
from eventspec.shared.node.serving import MODEL_DTYPES, NodeServer
from eventspec.shared.wire.flags import (
    add_client_security_args,
    add_health_port_arg,
    add_server_security_args,
    client_security_from_args,
    server_security_from_args,
)
from eventspec.shared.wire.options import SMALL_REQUEST_BYTES

PROG = "eventspec-edge"

log = logging.getLogger("eventspec.edge")


def build_parser() -> argparse.ArgumentParser:
    """The ``eventspec-edge`` parser; ``--help`` shows every default and its variable."""
    env = env_defaults(PROG, ENV_PREFIX, EdgeSettings.from_env)
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cmd = sub.add_parser("serve", help="serve eventspec.v1.EdgeAgent over gRPC",
                               formatter_class=DefaultsHelpFormatter)
    arg = partial(add_setting, serve_cmd, ENV_PREFIX)
    arg("--cloud", default=env.cloud,
        help="the cloud verifier: HOST:PORT, dns:///NAME:PORT (every replica the name "
             "resolves to) or IP:PORT,IP:PORT,... (replicas, balanced round_robin with "
             "health checks); omit for draft_only")
    arg("--source", default=env.source,
        help="PATH (format detected from its header/extension) | KIND:PATH with KIND "
             "aedat4, raw, evt2, evt3, dat, bin, txt, dsec, npy, npz | dv-net:HOST:PORT | "
             "dv-camera[:SERIAL] | prophesee-camera[:SERIAL] | toy[:SEED|:A-B] (A-B: "
             "scenes A..B-1) | synthetic[:SEED]; see docs/input-formats.md")
    arg("--sensor-size", default=env.sensor_size, metavar="WxH",
        help="sensor size for files that do not state it (e.g. 640x480); a size in the "
             "file's header wins")
    arg("--allow-pickle", action="store_true", default=env.allow_pickle,
        help="allow EventGPT's pickled .npy files (loading a pickle runs code from the "
             "file: only for files you trust)")
    arg("--max-source-events", type=int, default=env.max_source_events,
        help="the most events a source read whole (npz, npy, txt, bin) may hold, checked "
             "against what the file declares before it is read (text: while parsed); "
             "about 13 bytes of memory each")
    arg("--max-source-bytes", type=int, default=env.max_source_bytes,
        help="the most bytes such a source may decode: a zip member's uncompressed size, "
             "the arrays an .npy/.npz header declares, a text, .bin or pickled file's size")
    arg("--model", default=env.model,
        help="a local EventGPT-7b directory, toy (the embedded toy-world model, with its "
             "adapter), toy-misaligned (the toy drafter on other wording: low acceptance, "
             "for --draft-head) or tiny-random")
    arg("--adapter", type=Path, default=env.adapter,
        help="feature adapter directory, or toy (enables the aligned feature mode)")
    arg("--host", default=env.host, help="bind address")
    arg("--port", type=int, default=env.port, help="port, 1..65535; 0 picks a free one")
    arg("--device", default=env.device, help="cpu, cuda or cuda:N")
    arg("--dtype", default=env.dtype, choices=list(MODEL_DTYPES),
        help="the draft model's weights")
    arg("--jpeg-quality", type=int, default=env.default_jpeg_quality,
        help="JPEG quality of frames sent to the cloud, 1..100")
    arg("--request-timeout", type=float, default=env.request_timeout_s,
        help="deadline of one request's stream to the cloud, seconds")
    arg("--rpc-timeout-s", type=float, default=env.rpc_timeout_s,
        help="deadline of GetServerInfo and the other single calls to the cloud")
    arg("--cloud-wait-s", type=float, default=env.cloud_wait_s,
        help="how long an Ask waits for a cloud verifier that is warming up or briefly "
             "unreachable, streaming progress, before it fails (never past the Ask's "
             "deadline)")
    arg("--cloud-first-reply-s", type=float, default=env.cloud_first_reply_s,
        help="a cloud replica that sends no Plan this long after a request's Open is "
             "taken for hung, and the request moves to another replica if nothing was "
             "committed")
    arg("--cloud-rest-s", type=float, default=env.cloud_rest_s,
        help="a replica taken for hung rests this long, then is probed out of band and "
             "takes requests again only once a probe answers")
    arg("--max-queued-asks", type=int, default=env.max_queued_asks,
        help="Asks that may wait in line for a cloud slot (the edge keeps to the sessions "
             "its cloud advertises); more are refused with RESOURCE_EXHAUSTED")
    arg("--speculation", choices=list(SPECULATION_MODES), default=env.speculation,
        help="auto: draft when the timing plan says it pays (default); always: draft "
             "regardless, e.g. to measure acceptance")
    arg("--draft-engine", choices=list(DRAFT_ENGINES), default=env.draft_engine,
        help="static: EventGPT's LLM on the static-KV runtime (one KV slot, CUDA graphs); "
             "hf: the HF eager reference; auto: static on CUDA, hf on CPU; oracle: "
             "BENCHMARKS ONLY, drafts the --oracle-answers with --oracle-alpha")
    arg("--draft-quant", choices=list(DRAFT_QUANTS), default=env.draft_quant,
        help="the static drafter's decoder weights: none (the model dtype), int8 (per "
             "output channel) or int4 (groups of 128 inputs at 7B); weight-only")
    arg("--oracle-answers", type=Path, default=env.oracle_answers,
        help="--draft-engine oracle (benchmarks only): JSON object, question -> the "
             "target-only answer's token ids; a question it lacks drafts arbitrary ids "
             "(logged)")
    arg("--oracle-alpha", type=float, default=env.oracle_alpha,
        help="the oracle's chance that each draft is the answer's token, 0..1")
    arg("--oracle-ms-per-token", type=float, default=env.oracle_ms_per_token,
        help="the oracle's pace: ms per draft forward (default: the static bf16 drafter "
             "on an H200; int8 3.39, int4 2.96)")
    arg("--oracle-prefill-ms", type=float, default=env.oracle_prefill_ms,
        help="the oracle's prefill pace, ms (default: the static bf16 drafter's 737-token "
             "prefill on an H200)")
    arg("--oracle-seed", type=int, default=env.oracle_seed,
        help="seed of the oracle's right/wrong draws (per question and position)")
    arg("--oracle-coverage", type=float, default=env.oracle_coverage,
        help="benchmarks only: the oracle drafts trees; where its top-1 is wrong the "
             "true token is among its other top-k with this probability q (0: chains)")
    arg("--draft-head", type=Path, default=env.draft_head,
        help="a token adapter or draft head directory (eventspec-edge train-adapter): "
             "drafts its argmax, the target's predicted next token, from the HF "
             "drafter's hidden states")
    arg("--commit-log", type=Path, default=env.commit_log,
        help="log the drafter's hidden states at committed positions and the committed "
             "token ids (never events) to this directory, for train-adapter; off unless "
             "given")
    arg("--commit-log-max-mb", type=int, default=env.commit_log_max_mb,
        help="the commit log's bound in MiB: once reached, nothing more is logged")
    arg("--draft-slots", type=int, default=env.draft_slots,
        help="KV slots of the static drafter, one per request drafting at once; more "
             "requests take turns, rebuilding an evicted slot (a full-size slot of 2,048 "
             "positions is about 1 GiB in bf16)")
    arg("--profile", type=Path, default=env.profile_path,
        help="calibration profile file (vision, prefill and per-token draft costs of "
             "this drafter): reused at the next start when a warm-up agrees with it "
             "(default: ~/.cache/eventspec/edge-...)")
    arg("--recalibrate", action="store_true", default=env.recalibrate,
        help="measure the draft costs afresh even if a saved profile matches")
    arg("--vision-backend", choices=list(VISION_BACKENDS), default=env.vision_backend,
        help="what runs the vision path (CLIP, projector, adaptor, adapter): torch, or "
             "onnx: ONNX Runtime over the --onnx-dir export (CUDA execution provider in "
             "fp16 with onnxruntime-gpu and a CUDA --device, else CPU in fp32)")
    arg("--onnx-dir", type=Path, default=env.onnx_dir,
        help="an export of --model (and --adapter) made by `eventspec-edge export-onnx`, "
             "for --vision-backend onnx; a stale one is refused")
    arg("--acceptance-prior", type=float, default=env.acceptance_prior,
        help="the share of drafts the plan expects the cloud to accept before any request "
             "has been observed, 0..1")
    arg("--preview-every", type=int, default=env.preview_every,
        help="send the client a preview of the unverified answer every N drafted tokens "
             "(>= 1)")
    arg("--tree-nodes", type=int, default=env.tree_nodes,
        help="draft trees where the drafter expands several nodes in one forward and the "
             "cloud keeps trees: live nodes per request at most (0: chains only)")
    arg("--tree-top-k", type=int, default=env.tree_top_k,
        help="children per expanded tree node on the likeliest path (the drafter's top k)")
    arg("--tree-per-forward", type=int, default=env.tree_per_forward,
        help="tree nodes expanded per draft forward, likeliest path first")
    arg("--tree-branch-top-k", type=int, default=env.tree_branch_top_k,
        help="children per expanded tree node off the likeliest path (<= --tree-top-k)")
    arg("--drafts-every", type=int, default=env.drafts_every,
        help="draft forwards (chains: tokens) per Drafts message at least, 1..64 (the "
             "plan's cadence where that is more); fewer messages spare the cloud's host")
    arg("--max-message-bytes", type=int, default=env.max_message_bytes,
        help=f"largest gRPC message to clients and to and from the cloud, "
             f"{MIN_MESSAGE_BYTES}..{MAX_MESSAGE_BYTES} (a client's request: at most "
             f"{SMALL_REQUEST_BYTES >> 20} MiB)")
    arg("--grace-s", type=float, default=env.grace_s,
        help="on SIGTERM, how long Asks in flight may finish before they are cancelled")
    arg("--seed", type=int, default=env.seed,
        help="seed of --model tiny-random's random weights")
    add_run_args(serve_cmd, "the edge")
    add_health_port_arg(serve_cmd, ENV_PREFIX, env.health_port)
    add_metrics_args(serve_cmd, ENV_PREFIX, port=env.metrics_port, host=env.metrics_host)
    add_server_security_args(serve_cmd, ENV_PREFIX)
    add_client_security_args(serve_cmd, prefix="cloud-", env_prefix=f"{ENV_PREFIX}CLOUD_",
                             peer="cloud verifier")
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
    add_train_adapter_parser(sub)
    return parser


def add_train_adapter_parser(sub: Any) -> None:
    """``train-adapter``: a token adapter or draft head from a ``--commit-log`` directory."""
    from eventspec.edge.head_training import HeadTraining

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

    from eventspec.edge.head_training import HeadTraining
    from eventspec.edge.train_heads import train_from_log
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
    return checked(PROG, replace(
        EdgeSettings(),
        cloud=args.cloud,
        source=args.source,
        allow_pickle=args.allow_pickle,
        sensor_size=_sensor_size(args.sensor_size),
        max_source_events=args.max_source_events,
        max_source_bytes=args.max_source_bytes,
        model=args.model,
        adapter=args.adapter,
        host=args.host,
        port=args.port,
        health_port=args.health_port,
        device=args.device,
        dtype=args.dtype,
        default_jpeg_quality=args.jpeg_quality,
        request_timeout_s=args.request_timeout,
        rpc_timeout_s=args.rpc_timeout_s,
        cloud_wait_s=args.cloud_wait_s,
        cloud_first_reply_s=args.cloud_first_reply_s,
        cloud_rest_s=args.cloud_rest_s,
        max_queued_asks=args.max_queued_asks,
        acceptance_prior=args.acceptance_prior,
        preview_every=args.preview_every,
        tree_nodes=args.tree_nodes,
        tree_top_k=args.tree_top_k,
        tree_per_forward=args.tree_per_forward,
        tree_branch_top_k=args.tree_branch_top_k,
        drafts_every=args.drafts_every,
        speculation=args.speculation,
        draft_engine=args.draft_engine,
        draft_quant=args.draft_quant,
        draft_slots=args.draft_slots,
        oracle_answers=args.oracle_answers,
        oracle_alpha=args.oracle_alpha,
        oracle_ms_per_token=args.oracle_ms_per_token,
        oracle_prefill_ms=args.oracle_prefill_ms,
        oracle_seed=args.oracle_seed,
        oracle_coverage=args.oracle_coverage,
        draft_head=args.draft_head,
        commit_log=args.commit_log,
        commit_log_max_mb=args.commit_log_max_mb,
        profile_path=args.profile,
        recalibrate=args.recalibrate,
        vision_backend=args.vision_backend,
        onnx_dir=args.onnx_dir,
        grace_s=args.grace_s,
        seed=args.seed,
        max_message_bytes=args.max_message_bytes,
        security=server_security_from_args(args, ENV_PREFIX),
        cloud_security=client_security_from_args(args, prefix="cloud-",
                                                 env_prefix=f"{ENV_PREFIX}CLOUD_"),
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
    ))


def _sensor_size(value: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """``--sensor-size WxH`` parsed; the environment's default arrives parsed already."""
    if value is None or isinstance(value, tuple):
        return value
    from eventspec.edge.events.sources import parse_sensor_size
    from eventspec.shared.contract.errors import InvalidInput

    try:
        return parse_sensor_size(value)
    except InvalidInput as exc:
        refuse(PROG, f"--sensor-size: {exc}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "export-onnx":
        return export_onnx_command(args)
    if args.command == "train-adapter":
        return train_adapter_command(args)
    settings = settings_from_args(args)
    _check_source(settings)
    return serve(PROG, args, log, settings, _server,
                 scratch_model=_tiny_random_draft if settings.model == TINY_RANDOM else None)


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
        from eventspec.edge.onnx_export import export_onnx
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


def _tiny_random_draft(scratch: Path, seed: int) -> Path:
    """``--model tiny-random``: the demo world writes its tiny random draft into the
    scratch directory, which the server loads like any other.

    The edge's only import of the demo world, here at the command's edge and lazy, so
    the server itself knows nothing but model directories.
    """
    from eventspec.demoworld.tiny_draft import TINY_DRAFT_ID, save_tiny_random_draft

    return save_tiny_random_draft(scratch / f"{TINY_DRAFT_ID}-{seed}", seed)


if __name__ == "__main__":
    sys.exit(main())
