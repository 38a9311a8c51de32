"""The edge node's settings: one object, built from CLI flags and environment, passed down."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from eventspec.shared.node.node_cli import (
    Env,
    SettingsError,
    require_choice,
    require_fraction,
    require_int,
    require_seconds,
)
from eventspec.shared.node.serving import MODEL_DTYPES
from eventspec.shared.wire.security import ClientSecurity, ServerSecurity

__all__ = ["ENV_PREFIX", "EdgeSettings", "SettingsError", "check_cloud_address"]

#: Every flag ``--some-flag`` of ``eventspec-edge serve`` has the variable
#: ``EVENTSPEC_EDGE_SOME_FLAG`` (``eventspec.shared.node.node_cli``).
ENV_PREFIX = "EVENTSPEC_EDGE_"
#: ``--speculation`` modes.
SPECULATION_MODES = ("auto", "always")
#: ``--draft-engine`` choices: the static-KV runtime, the HF reference, static on CUDA,
#: or the oracle (benchmarks only: ``eventspec.edge.oracle_draft``).
DRAFT_ENGINES = ("auto", "static", "hf", "oracle")
#: ``--draft-quant`` choices: the drafter's decoder weights in the model dtype, int8
#: (per channel) or int4 (grouped, 128 at 7B).
DRAFT_QUANTS = ("none", "int8", "int4")
#: ``--vision-backend`` choices (eventspec.edge.vision_backend).
VISION_BACKENDS = ("torch", "onnx")
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


@dataclass(frozen=True)
class EdgeSettings:
    """Everything the edge agent needs; see ``eventspec-edge serve --help``."""

    cloud: str | None = None
    source: str = "toy"
    allow_pickle: bool = False
    #: (width, height) for files that do not state their sensor size (RAW without a
    #: geometry or known plugin, DAT, bin, txt, npz) and for live streams.
    sensor_size: tuple[int, int] | None = None
    #: The most events, and decoded bytes, a source read whole (npz, npy, txt, bin) may
    #: bring into memory: checked against what the file declares (headers, a zip
    #: member's size) before reading, and for text while parsing, so a small compressed
    #: file cannot decode into GBs (issue 38: a 1.7 MB .npz reached 5.9 GB).
    max_source_events: int = DEFAULT_MAX_SOURCE_EVENTS
    max_source_bytes: int = DEFAULT_MAX_SOURCE_BYTES
    model: str = "toy"
    adapter: Path | None = None
    host: str = "127.0.0.1"
    port: int = 50062
    #: grpc.health.v1 alone on its own plaintext port (None: off), for probes.
    health_port: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    default_jpeg_quality: int = 90
    #: Deadline for one request's Generate stream to the cloud.
    request_timeout_s: float = 120.0
    #: Deadline for GetServerInfo and other unary calls.
    rpc_timeout_s: float = 5.0
    #: How long an Ask waits for a cloud that is warming up or briefly unreachable
    #: (never past the Ask's own deadline).
    cloud_wait_s: float = 60.0
    #: A cloud replica that sends nothing (not even its Plan) this long after an Open is
    #: taken for hung: the request moves to another replica if nothing was committed.
    cloud_first_reply_s: float = 5.0
    #: A replica taken for hung rests this long, then is probed out of band and takes
    #: requests again only once a probe answers (issue 38).
    cloud_rest_s: float = 30.0
    #: Asks that may wait for a cloud slot (beyond those in flight) before more are
    #: refused with RESOURCE_EXHAUSTED.
    max_queued_asks: int = 256
    #: Acceptance prior before any request has been observed.
    acceptance_prior: float = 0.5
    #: Send a Preview to the client every N drafted tokens.
    preview_every: int = 4
    #: Draft trees (issue 36), where the drafter expands several nodes in one forward and
    #: the cloud keeps trees: live nodes per request at most (0: chains only), children
    #: per expanded node on the likeliest path, nodes expanded per forward, and children
    #: per expanded node off the likeliest path (the defaults: docs/trees.md).
    tree_nodes: int = 128
    tree_top_k: int = 4
    tree_per_forward: int = 8
    tree_branch_top_k: int = 1
    #: Draft forwards (chains: tokens) per Drafts message at least; the plan's cadence
    #: where that is more. Fewer, larger messages spare the cloud's host.
    drafts_every: int = 1
    #: "auto": draft when the shared timing plan says it pays; "always": draft anyway
    #: (to measure acceptance, or when the cost model is known to be wrong).
    speculation: str = "auto"
    #: What drafts: "static" (the static-KV runtime the cloud's engine uses: one KV slot,
    #: CUDA graphs, rollback as a length change), "hf" (the HF eager reference), or
    #: "auto" (static on CUDA when the model is a plain LLaMA decoder, hf otherwise).
    draft_engine: str = "auto"
    #: The static drafter's decoder weights: "none" (the model dtype), "int8" (one scale
    #: per output channel) or "int4" (groups of 128 inputs at 7B); weight-only, the
    #: activations stay in the model dtype.
    draft_quant: str = "none"
    #: KV slots of the static drafter: requests drafting at once beyond this take turns
    #: (the least recently used slot is rebuilt from its request's prompt and tokens).
    draft_slots: int = 2
    #: ``--draft-engine oracle`` (benchmarks only): JSON question -> the target-only
    #: answer's token ids, which the oracle drafts, each wrong with probability
    #: 1 - ``oracle_alpha``, at ``oracle_ms_per_token`` per forward after a prefill of
    #: ``oracle_prefill_ms`` (defaults: the static bf16 drafter measured on an H200).
    oracle_answers: Path | None = None
    oracle_alpha: float = 0.8
    oracle_ms_per_token: float = 4.68
    oracle_prefill_ms: float = 36.1
    oracle_seed: int = 0
    #: The oracle's tree coverage q (issue 36): where its top-1 is wrong, the true token is
    #: among its other top-k children with this probability. 0: chains.
    oracle_coverage: float = 0.0
    #: A token adapter or distilled draft head (``eventspec-edge train-adapter``): the
    #: edge drafts its argmax (the target's predicted next token) from the HF drafter's
    #: hidden states instead of the drafter's own (``eventspec.edge.headed_draft``).
    draft_head: Path | None = None
    #: Where to log what a draft head learns from (the drafter's hidden states at
    #: committed positions and the committed token ids, never events); None: off.
    commit_log: Path | None = None
    #: The commit log's bound, MiB: once reached, nothing more is logged.
    commit_log_max_mb: int = 256
    #: The edge's calibration profile (vision, prefill and per-token draft costs for
    #: this drafter): reused at the next start after a spot check; None: the default
    #: file under ~/.cache/eventspec (``resolved_profile_path``).
    profile_path: Path | None = None
    #: Measure the draft costs afresh even if a saved profile matches.
    recalibrate: bool = False
    #: What runs the vision path (CLIP, projector, adaptor, adapter): "torch", or "onnx"
    #: (ONNX Runtime over the export in ``onnx_dir``: CUDA execution provider in fp16
    #: when onnxruntime-gpu is installed and the draft runs on CUDA, else CPU in fp32).
    vision_backend: str = "torch"
    #: An export made by ``eventspec-edge export-onnx`` (needed by ``--vision-backend onnx``).
    onnx_dir: Path | None = None
    grace_s: float = 5.0
    seed: int = 0
    max_message_bytes: int = 8 << 20
    #: How clients reach this edge: TLS, tokens, --insecure, reflection.
    security: ServerSecurity = field(default_factory=ServerSecurity)
    #: How this edge reaches the cloud: TLS / mutual TLS and its bearer token.
    cloud_security: ClientSecurity | None = None
    #: Prometheus ``/metrics`` over HTTP on this port (0 picks one); None: off.
    metrics_port: int | None = None
    #: Address the metrics endpoint binds (loopback unless told otherwise).
    metrics_host: str = "127.0.0.1"

    @staticmethod
    def from_env() -> EdgeSettings:
        """Defaults overridden by EVENTSPEC_EDGE_* environment variables, one per flag
        (``--cloud-wait-s``: ``EVENTSPEC_EDGE_CLOUD_WAIT_S``; the security ones are read
        by ``eventspec.shared.wire.flags``).

        Raises SettingsError naming the variable when one does not parse.
        """
        e, d = Env(ENV_PREFIX), EdgeSettings()
        return EdgeSettings(
            cloud=e.optional_text("CLOUD"),
            source=e.text("SOURCE", d.source),
            allow_pickle=e.switch("ALLOW_PICKLE", d.allow_pickle),
            sensor_size=_env_sensor_size(e),
            max_source_events=e.integer("MAX_SOURCE_EVENTS", d.max_source_events),
            max_source_bytes=e.integer("MAX_SOURCE_BYTES", d.max_source_bytes),
            model=e.text("MODEL", d.model),
            adapter=e.path("ADAPTER"),
            host=e.text("HOST", d.host),
            port=e.integer("PORT", d.port),
            health_port=e.optional_integer("HEALTH_PORT"),
            device=e.text("DEVICE", d.device),
            dtype=e.text("DTYPE", d.dtype),
            default_jpeg_quality=e.integer("JPEG_QUALITY", d.default_jpeg_quality),
            request_timeout_s=e.number("REQUEST_TIMEOUT", d.request_timeout_s),
            rpc_timeout_s=e.number("RPC_TIMEOUT_S", d.rpc_timeout_s),
            cloud_wait_s=e.number("CLOUD_WAIT_S", d.cloud_wait_s),
            cloud_first_reply_s=e.number("CLOUD_FIRST_REPLY_S", d.cloud_first_reply_s),
            cloud_rest_s=e.number("CLOUD_REST_S", d.cloud_rest_s),
            max_queued_asks=e.integer("MAX_QUEUED_ASKS", d.max_queued_asks),
            acceptance_prior=e.number("ACCEPTANCE_PRIOR", d.acceptance_prior),
            preview_every=e.integer("PREVIEW_EVERY", d.preview_every),
            tree_nodes=e.integer("TREE_NODES", d.tree_nodes),
            tree_top_k=e.integer("TREE_TOP_K", d.tree_top_k),
            tree_per_forward=e.integer("TREE_PER_FORWARD", d.tree_per_forward),
            tree_branch_top_k=e.integer("TREE_BRANCH_TOP_K", d.tree_branch_top_k),
            drafts_every=e.integer("DRAFTS_EVERY", d.drafts_every),
            speculation=e.text("SPECULATION", d.speculation),
            draft_engine=e.text("DRAFT_ENGINE", d.draft_engine),
            draft_quant=e.text("DRAFT_QUANT", d.draft_quant),
            draft_slots=e.integer("DRAFT_SLOTS", d.draft_slots),
            oracle_answers=e.path("ORACLE_ANSWERS"),
            oracle_alpha=e.number("ORACLE_ALPHA", d.oracle_alpha),
            oracle_ms_per_token=e.number("ORACLE_MS_PER_TOKEN", d.oracle_ms_per_token),
            oracle_prefill_ms=e.number("ORACLE_PREFILL_MS", d.oracle_prefill_ms),
            oracle_seed=e.integer("ORACLE_SEED", d.oracle_seed),
            oracle_coverage=e.number("ORACLE_COVERAGE", d.oracle_coverage),
            draft_head=e.path("DRAFT_HEAD"),
            commit_log=e.path("COMMIT_LOG"),
            commit_log_max_mb=e.integer("COMMIT_LOG_MAX_MB", d.commit_log_max_mb),
            profile_path=e.path("PROFILE"),
            recalibrate=e.switch("RECALIBRATE", d.recalibrate),
            vision_backend=e.text("VISION_BACKEND", d.vision_backend),
            onnx_dir=e.path("ONNX_DIR"),
            grace_s=e.number("GRACE_S", d.grace_s),
            seed=e.integer("SEED", d.seed),
            max_message_bytes=e.integer("MAX_MESSAGE_BYTES", d.max_message_bytes),
            metrics_port=e.optional_integer("METRICS_PORT"),
            metrics_host=e.text("METRICS_HOST", d.metrics_host),
        )

    def resolved_profile_path(self, model_id: str) -> Path:
        """``--profile``, or one file per model, device, dtype, drafter and quantisation
        under ``$XDG_CACHE_HOME/eventspec`` (so switching ``--draft-quant`` back and forth
        keeps both profiles)."""
        if self.profile_path is not None:
            return self.profile_path
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_id)
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        name = f"edge-{safe}-{self.device}-{self.dtype}-{self.draft_engine}-{self.draft_quant}"
        return base / "eventspec" / f"{name}.msgpack"

    def check(self) -> None:
        """Refuse at start-up what would otherwise fail every request later.

        A negative request timeout, for one, was accepted and then expired every
        request's cloud stream at once. Raises SettingsError naming the flag.
        """
        require_int("--port", self.port, 0, 65535, "0 picks one")
        if self.health_port is not None:
            require_int("--health-port", self.health_port, 0, 65535, "0 picks one")
        if self.metrics_port is not None:
            require_int("--metrics-port", self.metrics_port, 0, 65535, "0 picks one")
        require_choice("--dtype", self.dtype, MODEL_DTYPES)
        require_choice("--speculation", self.speculation, SPECULATION_MODES)
        require_choice("--draft-engine", self.draft_engine, DRAFT_ENGINES)
        require_choice("--draft-quant", self.draft_quant, DRAFT_QUANTS)
        require_int("--draft-slots", self.draft_slots, 1, 1024)
        if self.draft_quant != "none" and self.draft_engine == "hf":
            raise SettingsError(
                f"--draft-quant {self.draft_quant} needs the static drafter, not "
                "--draft-engine hf"
            )
        self._check_oracle()
        self._check_draft_head()
        require_choice("--vision-backend", self.vision_backend, VISION_BACKENDS)
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


def _env_sensor_size(e: Env) -> tuple[int, int] | None:
    text = e.optional_text("SENSOR_SIZE")
    if text is None:
        return None
    from eventspec.edge.events.sources import parse_sensor_size
    from eventspec.shared.contract.errors import InvalidInput

    try:
        return parse_sensor_size(text)
    except InvalidInput as exc:
        raise SettingsError(f"${ENV_PREFIX}SENSOR_SIZE={text!r}: {exc}") from None


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
