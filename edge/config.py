"""The edge node's settings: one object, built from CLI flags and environment, passed down."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from eventspec.shared.node.node_cli import (
    SettingsError,
    require_fraction,
    require_int,
    require_seconds,
)
from eventspec.shared.node.node_settings import (
    FromEnv,
    check_ports,
    device_setting,
    dtype_setting,
    grace_setting,
    health_port_setting,
    host_setting,
    metrics_host_setting,
    metrics_port_setting,
    port_setting,
    profile_path,
    seed_setting,
)
from eventspec.shared.node.settings_fields import setting
from eventspec.shared.wire.options import SMALL_REQUEST_BYTES
from eventspec.shared.wire.security import ClientSecurity, ServerSecurity

__all__ = ["ENV_PREFIX", "EdgeSettings", "SettingsError", "check_cloud_address"]

#: Every flag ``--some-flag`` of ``eventspec-edge serve`` has the variable
#: ``EVENTSPEC_EDGE_SOME_FLAG`` (``eventspec.shared.node.node_cli``).
ENV_PREFIX = "EVENTSPEC_EDGE_"
#: ``--speculation`` modes.
SPECULATION_MODES = ("auto", "always")
#: ``--draft-engine`` choices: the static-KV runtime, the HF reference, static on CUDA,
#: or the oracle (benchmarks only: ``eventspec.edge.drafting.oracle_backend``).
DRAFT_ENGINES = ("auto", "static", "hf", "oracle")
#: ``--draft-quant`` choices: the drafter's decoder weights in the model dtype, int8
#: (per channel) or int4 (grouped, 128 at 7B).
DRAFT_QUANTS = ("none", "int8", "int4")
#: ``--vision-backend`` choices (eventspec.edge.vision.backend).
VISION_BACKENDS = ("torch", "onnx")
#: ``--vision-ort-provider`` choices (eventspec.edge.vision.onnx_backend.PROVIDER_CHOICES,
#: kept apart so the settings import no ONNX Runtime; a unit test holds them equal).
VISION_ORT_PROVIDERS = ("auto", "cuda", "tensorrt")
#: ``--seed`` spans what ``torch.manual_seed`` takes.
SEED_MAX = 2**64 - 1
#: ``--max-message-bytes``: below 1 MiB an Open with its frames may not fit; gRPC's own
#: limit is an int32.
MIN_MESSAGE_BYTES = 1 << 20
MAX_MESSAGE_BYTES = 2**31 - 1
#: ``--max-source-events`` / ``--max-source-bytes`` defaults; the same numbers as
#: ``eventspec.edge.events.limits`` (kept apart so the settings import no numpy; a unit
#: test holds them equal).
DEFAULT_MAX_SOURCE_EVENTS = 10_000_000
DEFAULT_MAX_SOURCE_BYTES = 512 << 20


def _sensor_size(text: str) -> tuple[int, int]:
    """``--sensor-size`` / its variable: ``WxH``; ValueError naming the form otherwise.
    The parser is imported here, when one is given, so the settings import no numpy."""
    from eventspec.edge.events.sources import parse_sensor_size
    from eventspec.shared.contract.errors import InvalidInput

    try:
        return parse_sensor_size(text)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True)
class EdgeSettings(FromEnv):
    """Everything the edge agent needs; see ``eventspec-edge serve --help``.

    Each setting is declared once, here (those both nodes have alike, in
    ``eventspec.shared.node.node_settings``): its field's ``setting`` is its flag, its
    ``EVENTSPEC_EDGE_*`` variable (``from_env``) and its help
    (``eventspec.shared.node.settings_fields``).
    """

    ENV_PREFIX = ENV_PREFIX

    cloud: str | None = setting(
        None, help="the cloud verifier: HOST:PORT, dns:///NAME:PORT (every replica the name "
                   "resolves to) or IP:PORT,IP:PORT,... (replicas, balanced round_robin with "
                   "health checks); omit for draft_only")
    source: str = setting(
        "toy", help="PATH (format detected from its header/extension) | KIND:PATH with KIND "
                    "aedat4, raw, evt2, evt3, dat, bin, txt, dsec, npy, npz | dv-net:HOST:PORT "
                    "| dv-camera[:SERIAL] | prophesee-camera[:SERIAL] | toy[:SEED|:A-B] (A-B: "
                    "scenes A..B-1) | synthetic[:SEED]; see docs/input-formats.md")
    #: (width, height) for files that do not state their sensor size (RAW without a
    #: geometry or known plugin, DAT, bin, txt, npz) and for live streams.
    sensor_size: tuple[int, int] | None = setting(
        None, parse=_sensor_size, metavar="WxH",
        help="sensor size for files that do not state it (e.g. 640x480); a size in the "
             "file's header wins")
    allow_pickle: bool = setting(
        False, help="allow EventGPT's pickled .npy files (loading a pickle runs code from the "
                    "file: only for files you trust)")
    #: The most events, and decoded bytes, a source read whole (npz, npy, txt, bin) may
    #: bring into memory: checked against what the file declares (headers, a zip
    #: member's size) before reading, and for text while parsing, so a small compressed
    #: file cannot decode into GBs (issue 38: a 1.7 MB .npz reached 5.9 GB).
    max_source_events: int = setting(
        DEFAULT_MAX_SOURCE_EVENTS,
        help="the most events a source read whole (npz, npy, txt, bin) may hold, checked "
             "against what the file declares before it is read (text: while parsed); about "
             "13 bytes of memory each")
    max_source_bytes: int = setting(
        DEFAULT_MAX_SOURCE_BYTES,
        help="the most bytes such a source may decode: a zip member's uncompressed size, the "
             "arrays an .npy/.npz header declares, a text, .bin or pickled file's size")
    model: str = setting(
        "toy", help="a local EventGPT-7b directory, toy (the embedded toy-world model, with "
                    "its adapter), toy-misaligned (the toy drafter on other wording: low "
                    "acceptance, for --draft-head) or tiny-random")
    adapter: Path | None = setting(
        None, help="feature adapter directory, or toy (enables the aligned feature mode)")
    host: str = host_setting()
    port: int = port_setting(50062)
    device: str = device_setting()
    dtype: str = dtype_setting("the draft model's weights")
    default_jpeg_quality: int = setting(
        90, flag="--jpeg-quality", help="JPEG quality of frames sent to the cloud, 1..100")
    #: Deadline for one request's Generate stream to the cloud.
    request_timeout_s: float = setting(
        120.0, flag="--request-timeout",
        help="deadline of one request's stream to the cloud, seconds")
    rpc_timeout_s: float = setting(
        5.0, help="deadline of GetServerInfo and the other single calls to the cloud")
    cloud_wait_s: float = setting(
        60.0, help="how long an Ask waits for a cloud verifier that is warming up or briefly "
                   "unreachable, streaming progress, before it fails (never past the Ask's "
                   "deadline)")
    #: "Hung" means nothing at all, not even its Plan.
    cloud_first_reply_s: float = setting(
        5.0, help="a cloud replica that sends no Plan this long after a request's Open is "
                  "taken for hung, and the request moves to another replica if nothing was "
                  "committed")
    #: Issue 38.
    cloud_rest_s: float = setting(
        30.0, help="a replica taken for hung rests this long, then is probed out of band and "
                   "takes requests again only once a probe answers")
    #: Beyond those in flight.
    max_queued_asks: int = setting(
        256, help="Asks that may wait in line for a cloud slot (the edge keeps to the "
                  "sessions its cloud advertises); more are refused with RESOURCE_EXHAUSTED")
    #: "always" also serves when the cost model is known to be wrong.
    speculation: str = setting(
        "auto", choices=SPECULATION_MODES,
        help="auto: draft when the timing plan says it pays (default); always: draft "
             "regardless, e.g. to measure acceptance")
    #: "static" is the static-KV runtime the cloud's engine uses (rollback as a length
    #: change); "auto" takes it on CUDA when the model is a plain LLaMA decoder.
    draft_engine: str = setting(
        "auto", choices=DRAFT_ENGINES,
        help="static: EventGPT's LLM on the static-KV runtime (one KV slot, CUDA graphs); "
             "hf: the HF eager reference; auto: static on CUDA, hf on CPU; oracle: "
             "BENCHMARKS ONLY, drafts the --oracle-answers with --oracle-alpha")
    #: Weight-only: the activations stay in the model dtype.
    draft_quant: str = setting(
        "none", choices=DRAFT_QUANTS,
        help="the static drafter's decoder weights: none (the model dtype), int8 (per output "
             "channel) or int4 (groups of 128 inputs at 7B); weight-only")
    #: ``--draft-engine oracle`` (benchmarks only) drafts each answer's token ids, each
    #: wrong with probability 1 - ``oracle_alpha``, at ``oracle_ms_per_token`` per forward
    #: after a prefill of ``oracle_prefill_ms`` (defaults: the static bf16 drafter
    #: measured on an H200).
    oracle_answers: Path | None = setting(
        None, help="--draft-engine oracle (benchmarks only): JSON object, question -> the "
                   "target-only answer's token ids; a question it lacks drafts arbitrary ids "
                   "(logged)")
    oracle_alpha: float = setting(
        0.8, help="the oracle's chance that each draft is the answer's token, 0..1")
    oracle_ms_per_token: float = setting(
        4.68, help="the oracle's pace: ms per draft forward (default: the static bf16 drafter "
                   "on an H200; int8 3.39, int4 2.96)")
    oracle_prefill_ms: float = setting(
        36.1, help="the oracle's prefill pace, ms (default: the static bf16 drafter's "
                   "737-token prefill on an H200)")
    oracle_seed: int = setting(
        0, help="seed of the oracle's right/wrong draws (per question and position)")
    #: Issue 36.
    oracle_coverage: float = setting(
        0.0, help="benchmarks only: the oracle drafts trees; where its top-1 is wrong the "
                  "true token is among its other top-k with this probability q (0: chains)")
    #: ``eventspec.edge.drafting.headed_backend``: drafted instead of the drafter's own argmax.
    draft_head: Path | None = setting(
        None, help="a token adapter or draft head directory (eventspec-edge train-adapter): "
                   "drafts its argmax, the target's predicted next token, from the HF "
                   "drafter's hidden states")
    commit_log: Path | None = setting(
        None, help="log the drafter's hidden states at committed positions and the committed "
                   "token ids (never events) to this directory, for train-adapter; off unless "
                   "given")
    commit_log_max_mb: int = setting(
        256, help="the commit log's bound in MiB: once reached, nothing more is logged")
    #: Beyond this, the least recently used slot is rebuilt from its request's prompt and
    #: tokens.
    draft_slots: int = setting(
        2, help="KV slots of the static drafter, one per request drafting at once; more "
                "requests take turns, rebuilding an evicted slot (a full-size slot of 2,048 "
                "positions is about 1 GiB in bf16)")
    #: None: the default file under ~/.cache/eventspec (``resolved_profile_path``).
    profile_path: Path | None = setting(
        None, flag="--profile",
        help="calibration profile file (vision, prefill and per-token draft costs of this "
             "drafter): reused at the next start when a warm-up agrees with it (default: "
             "~/.cache/eventspec/edge-...)")
    recalibrate: bool = setting(
        False, help="measure the draft costs afresh even if a saved profile matches")
    vision_backend: str = setting(
        "torch", choices=VISION_BACKENDS,
        help="what runs the vision path (CLIP, projector, adaptor, adapter): torch, or onnx: "
             "ONNX Runtime over the --onnx-dir export (CUDA execution provider in fp16 with "
             "onnxruntime-gpu and a CUDA --device, else CPU in fp32)")
    onnx_dir: Path | None = setting(
        None, help="an export of --model (and --adapter) made by `eventspec-edge export-onnx`, "
                   "for --vision-backend onnx; a stale one is refused")
    vision_ort_provider: str = setting(
        "auto", choices=VISION_ORT_PROVIDERS,
        help="--vision-backend onnx's execution provider: auto (CUDA with a CUDA --device and "
             "onnxruntime-gpu, else CPU), cuda (the CUDA EP or refuse to start), tensorrt "
             "(TensorRT building fp16 engines, cached under ~/.cache/eventspec/ort-trt; "
             "the CUDA EP, with a warning, where TensorRT's libraries are absent)")
    vision_ort_cuda_graphs: bool = setting(
        True, on_off=True,
        help="--vision-backend onnx on a GPU: replay each graph as a CUDA graph captured at "
             "start (a graph that cannot be captured runs without, with a warning)")
    acceptance_prior: float = setting(
        0.5, help="the share of drafts the plan expects the cloud to accept before any "
                  "request has been observed, 0..1")
    preview_every: int = setting(
        4, help="send the client a preview of the unverified answer every N drafted tokens "
                "(>= 1)")
    #: Draft trees (issue 36; the defaults: docs/trees.md).
    tree_nodes: int = setting(
        128, help="draft trees where the drafter expands several nodes in one forward and the "
                  "cloud keeps trees: live nodes per request at most (0: chains only)")
    tree_top_k: int = setting(
        4, help="children per expanded tree node on the likeliest path (the drafter's top k)")
    tree_per_forward: int = setting(
        8, help="tree nodes expanded per draft forward, likeliest path first")
    tree_branch_top_k: int = setting(
        1, help="children per expanded tree node off the likeliest path (<= --tree-top-k)")
    drafts_every: int = setting(
        1, help="draft forwards (chains: tokens) per Drafts message at least, 1..64 (the "
                "plan's cadence where that is more); fewer messages spare the cloud's host")
    max_message_bytes: int = setting(
        8 << 20, help=f"largest gRPC message to clients and to and from the cloud, "
                      f"{MIN_MESSAGE_BYTES}..{MAX_MESSAGE_BYTES} (a client's request: at most "
                      f"{SMALL_REQUEST_BYTES >> 20} MiB)")
    grace_s: float = grace_setting("Asks")
    seed: int = seed_setting()
    #: grpc.health.v1 alone on its own plaintext port (None: off), for probes.
    health_port: int | None = health_port_setting()
    #: Prometheus ``/metrics`` over HTTP on this port (0 picks one); None: off.
    metrics_port: int | None = metrics_port_setting()
    metrics_host: str = metrics_host_setting()
    #: How clients reach this edge: TLS, tokens, --insecure, reflection.
    security: ServerSecurity = field(default_factory=ServerSecurity)
    #: How this edge reaches the cloud: TLS / mutual TLS and its bearer token.
    cloud_security: ClientSecurity | None = None

    def resolved_profile_path(self, model_id: str) -> Path:
        """``--profile``, or one file per model, device, dtype, drafter and quantisation
        under ``$XDG_CACHE_HOME/eventspec`` (so switching ``--draft-quant`` back and forth
        keeps both profiles)."""
        return profile_path(self.profile_path, "edge", model_id, self.device, self.dtype,
                            self.draft_engine, self.draft_quant)

    def check(self) -> None:
        """Refuse at start-up what would otherwise fail every request later.

        A negative request timeout, for one, was accepted and then expired every
        request's cloud stream at once. Raises SettingsError naming the flag.
        """
        check_ports(self)
        require_int("--draft-slots", self.draft_slots, 1, 1024)
        if self.draft_quant != "none" and self.draft_engine == "hf":
            raise SettingsError(
                f"--draft-quant {self.draft_quant} needs the static drafter, not "
                "--draft-engine hf"
            )
        self._check_oracle()
        self._check_draft_head()
        require_seconds("--request-timeout", self.request_timeout_s, zero_ok=False)
        require_seconds("--rpc-timeout-s", self.rpc_timeout_s, zero_ok=False)
        require_seconds("--cloud-wait-s", self.cloud_wait_s, zero_ok=True)
        require_seconds("--cloud-first-reply-s", self.cloud_first_reply_s, zero_ok=False)
        require_seconds("--cloud-rest-s", self.cloud_rest_s, zero_ok=True)
        require_seconds("--grace-s", self.grace_s, zero_ok=True)
        require_int("--max-queued-asks", self.max_queued_asks, 0, 100_000)
        require_int("--jpeg-quality", self.default_jpeg_quality, 1, 100)
        require_fraction("--acceptance-prior", self.acceptance_prior, zero_ok=True)
        require_int("--preview-every", self.preview_every, 1)
        require_int("--tree-nodes", self.tree_nodes, 0, 4096, "0 drafts chains")
        require_int("--tree-top-k", self.tree_top_k, 1, 64)
        require_int("--tree-per-forward", self.tree_per_forward, 1, 256)
        require_int("--tree-branch-top-k", self.tree_branch_top_k, 1, self.tree_top_k,
                    "at most --tree-top-k")
        require_int("--drafts-every", self.drafts_every, 1, 64)
        require_int("--seed", self.seed, 0, SEED_MAX)
        require_int("--max-message-bytes", self.max_message_bytes, MIN_MESSAGE_BYTES,
                    MAX_MESSAGE_BYTES)
        require_int("--max-source-events", self.max_source_events, 1)
        require_int("--max-source-bytes", self.max_source_bytes, 1)
        if self.cloud is not None:
            check_cloud_address(self.cloud)

    def _check_draft_head(self) -> None:
        """A draft head reads the HF drafter's hidden states: no static or oracle engine."""
        if self.draft_head is not None and self.draft_engine not in ("auto", "hf"):
            raise SettingsError(f"--draft-head needs the HF drafter (--draft-engine hf or "
                                f"auto), not --draft-engine {self.draft_engine}")
        if self.draft_head is not None and self.draft_quant != "none":
            raise SettingsError("--draft-head needs the HF drafter: drop --draft-quant")
        require_int("--commit-log-max-mb", self.commit_log_max_mb, 1, 1 << 20)

    def _check_oracle(self) -> None:
        """The oracle's flags (ignored by the other engines): its answers file with it."""
        if self.draft_engine == "oracle":
            if self.oracle_answers is None:
                raise SettingsError("--draft-engine oracle needs --oracle-answers FILE (JSON: "
                                    "question -> the target-only answer's token ids)")
            if self.draft_quant != "none":
                raise SettingsError(f"--draft-quant {self.draft_quant} does not apply to "
                                    "--draft-engine oracle (give --oracle-ms-per-token)")
        require_fraction("--oracle-alpha", self.oracle_alpha, zero_ok=True)
        for flag, ms in (("--oracle-ms-per-token", self.oracle_ms_per_token),
                         ("--oracle-prefill-ms", self.oracle_prefill_ms)):
            if not (math.isfinite(ms) and ms >= 0):
                raise SettingsError(f"{flag} must be >= 0 ms, got {ms:g}")
        require_int("--oracle-seed", self.oracle_seed, 0, SEED_MAX)
        require_fraction("--oracle-coverage", self.oracle_coverage, zero_ok=True)


#: Cloud addresses with one of these schemes go to gRPC's resolver as they are.
_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "xds:")


def check_cloud_address(text: str) -> None:
    """HOST:PORT, a comma list of them, or a scheme address; a bare host would dial 443."""
    if text.startswith(_SCHEMES):
        return
    scheme, sep, rest = text.partition("://")
    if sep and scheme.lower() in ("http", "https", "grpc", "grpcs"):
        raise SettingsError(f"--cloud {text!r}: drop the scheme: gRPC takes HOST:PORT "
                            f"({rest.rstrip('/')!r}); for TLS add --cloud-tls")
    for item in text.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or (":" in host and not host.startswith("[")):
            raise SettingsError(f"--cloud {item.strip()!r} needs a port: HOST:PORT (the "
                                "verifier's default is 50061)")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise SettingsError(f"--cloud {item.strip()!r}: the port must be in 1..65535")
