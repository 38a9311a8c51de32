"""The cloud node's settings: one object, built from CLI flags and environment, passed down."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from eventspec.cloud.prefill_chunking import ChunkPolicy
from eventspec.cloud.session_capacity import (
    AUTO_SESSIONS,
    CPU_AUTO_SESSIONS,
    GPU_SESSION_CEILING,
    parse_max_sessions,
)
from eventspec.cloud.timeouts import (
    FEATURES_BASE_TIMEOUT_S,
    FEATURES_MAX_TIMEOUT_S,
    FIRST_MESSAGE_TIMEOUT_S,
)
from eventspec.shared.contract.types import ServerLimits
from eventspec.shared.node.metric_principals import PRINCIPAL_LABELS
from eventspec.shared.node.node_cli import (
    Env,
    SettingsError,
    require_choice,
    require_fraction,
    require_int,
    require_seconds,
)
from eventspec.shared.node.serving import MODEL_DTYPES
from eventspec.shared.wire.security import ServerSecurity

__all__ = ["ENV_PREFIX", "CloudSettings", "SettingsError"]

#: Every flag ``--some-flag`` of ``eventspec-cloud serve`` has the variable
#: ``EVENTSPEC_CLOUD_SOME_FLAG`` (``eventspec.shared.node.node_cli``).
ENV_PREFIX = "EVENTSPEC_CLOUD_"
#: ``--engine`` choices.
ENGINES = ("auto", "static", "hf")
#: The wire's ``GenerationConfig.max_new_tokens`` is an int32.
_INT32_MAX = 2**31 - 1
#: ``--seed`` spans what ``torch.manual_seed`` takes.
SEED_MAX = 2**64 - 1


#: ``--verify-width`` choices.
VERIFY_WIDTHS = ("auto", "all")
#: ``--kv-layout`` choices.
KV_LAYOUTS = ("by-length", "slots")


def _env_sessions(env: Env, default: int) -> int:
    """``EVENTSPEC_CLOUD_MAX_SESSIONS``: auto or an integer, SettingsError naming it."""
    text = env.text("MAX_SESSIONS", "")
    if not text:
        return default
    try:
        return parse_max_sessions(text)
    except ValueError as exc:
        raise SettingsError(f"{ENV_PREFIX}MAX_SESSIONS: {exc}") from None


@dataclass(frozen=True)
class CloudSettings:
    """Everything the verifier needs to start; see ``eventspec-cloud serve --help``."""

    model: str = "toy"
    host: str = "127.0.0.1"
    port: int = 50061
    #: grpc.health.v1 alone on its own plaintext port (None: off), for probes.
    health_port: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    #: ``limits.max_sessions`` 0 is ``--max-sessions auto`` (``eventspec.cloud.session_capacity``).
    limits: ServerLimits = field(
        default_factory=lambda: ServerLimits(max_sessions=AUTO_SESSIONS))
    #: KV memory budget in GiB (None: a fraction of free device memory, or a CPU default).
    kv_cache_gb: float | None = None
    #: Fraction of free device memory reserved for KV when ``kv_cache_gb`` is None (CUDA).
    kv_memory_fraction: float = 0.9
    #: Positions per KV slot (prompt + answer); None = the prompt, 256 question tokens and
    #: the answer cap, at most the model's (``eventspec.cloud.engine.kv.auto_max_seq_len``).
    max_seq_len: int | None = None
    #: "by-length": each request takes KV for its own prompt plus its answer cap from one
    #: arena (``eventspec.cloud.kv_arena``; the static engine); "slots": every request a
    #: slot of ``max_seq_len`` positions (the HF engine always).
    kv_layout: str = "by-length"
    #: Target engine: "static" (static KV slots, CUDA graphs), "hf" (the HF eager
    #: reference), or "auto" (static on CUDA, hf on CPU).
    engine: str = "auto"
    #: Widest verify forward: C[-1] plus up to this many minus one drafts.
    max_verify_tokens: int = 33
    #: "auto": each step verifies, per session, the drafts that maximise the batch's
    #: expected tokens per ms under the cost model (eventspec.shared.contract.verify_width);
    #: "all": every valid draft up to --max-verify-tokens.
    verify_width: str = "auto"
    #: Chunked prefill, decode first (``eventspec.cloud.prefill_chunking``): "off" (whole
    #: prompts), "auto" (a chunk costs about one step, from the cost model) or a number of
    #: tokens per iteration. The static engine only. 512: on an H100, 512-token chunks
    #: riding graphed mixed steps kept ITL p99 under 50 ms up to 8 requests/s, where
    #: whole prompts missed it at every rate (``load-h100-graphed-capacity.json``).
    prefill_chunk: str = "512"
    #: With chunking, the chunks ride the running sessions' step in one forward (mixed
    #: steps) where the engine can; False runs each chunk in a call of its own.
    mixed_steps: bool = True
    #: GiB of device memory for saved prompt prefixes (``eventspec.cloud.prefix_cache``):
    #: a clip asked about again skips its video prefill. 0 = off. Static engine only;
    #: taken out of the KV budget.
    prefix_cache_gb: float = 0.0
    #: Batch-invariant arithmetic (``eventspec.shared.node.static.invariant``): a greedy
    #: answer's logits do not depend on who else is in the batch. Static engine only;
    #: unfused and without CUDA graphs, so slow on a GPU (not measured there yet).
    batch_invariant: bool = False
    #: The interpreter's thread switch interval while the engine loop runs, in ms (0: leave
    #: Python's 5 ms). The engine thread gives up the GIL at every torch call and waits up
    #: to this long to get it back from the gRPC event loop (``eventspec.cloud.scheduler``).
    gil_switch_interval_ms: float = 0.1
    #: Freeze the garbage collector's view of the heap once warm (``eventspec.cloud.gc_freeze``):
    #: its full passes then skip the model and the engine, and stop pausing the loop.
    gc_freeze: bool = True
    #: Requests that may wait for a KV slot when all are taken (FIFO); 0 refuses at once.
    kv_queue: int = 64
    #: The longest a request waits in that queue (its own deadline may be sooner).
    kv_wait_s: float = 30.0
    #: Sessions older than this are released by the sweeper (a leak guard).
    session_ttl_s: float = 600.0
    #: How long a Generate call may take to send its Open (``eventspec.cloud.timeouts``).
    first_message_timeout_s: float = FIRST_MESSAGE_TIMEOUT_S
    #: Aligned features get this long plus their declared size over the edge's measured
    #: uplink (``eventspec.cloud.timeouts.features_timeout_s``) ...
    features_base_timeout_s: float = FEATURES_BASE_TIMEOUT_S
    #: ... but never longer than this after Open.
    input_timeout_s: float = FEATURES_MAX_TIMEOUT_S
    #: Concurrent Generate streams one principal may hold; 0 = all but one of
    #: ``limits.max_sessions`` (at least 1), so one caller always leaves a slot free.
    max_sessions_per_principal: int = 0
    #: Calibration profile file; None = under ~/.cache/eventspec.
    profile_path: Path | None = None
    #: Measure the cost model afresh even when a matching profile exists.
    recalibrate: bool = False
    #: Pace each prefill / step to at least this long (0 = off), to rehearse a slower
    #: cloud; see cloud/engine/paced.py.
    emulate_prefill_ms: float = 0.0
    emulate_step_ms: float = 0.0
    grace_s: float = 5.0
    #: After Done, how long to wait for the edge to half-close the stream.
    drain_timeout_s: float = 2.0
    seed: int = 0
    #: TLS, tokens, allowed principals, --insecure, reflection (``eventspec.shared.wire.flags``).
    security: ServerSecurity = field(default_factory=ServerSecurity)
    #: Prometheus ``/metrics`` over HTTP on this port (0 picks one); None: off.
    metrics_port: int | None = None
    #: Address the metrics endpoint binds (loopback unless told otherwise).
    metrics_host: str = "127.0.0.1"
    #: How the per-edge series name callers on the unauthenticated /metrics: "name",
    #: "hash" (a stable short SHA-256 digest) or "none" (one shared label); why the
    #: default is "name": ``eventspec.shared.node.metric_principals``.
    metrics_principals: str = "name"

    @staticmethod
    def from_env() -> CloudSettings:
        """Defaults overridden by EVENTSPEC_CLOUD_* environment variables, one per flag
        (``--session-ttl-s``: ``EVENTSPEC_CLOUD_SESSION_TTL_S``; the security ones are
        read by ``eventspec.shared.wire.flags``).

        Raises SettingsError naming the variable when one does not parse.
        """
        e, d = Env(ENV_PREFIX), CloudSettings()
        return CloudSettings(
            model=e.text("MODEL", d.model),
            host=e.text("HOST", d.host),
            port=e.integer("PORT", d.port),
            health_port=e.optional_integer("HEALTH_PORT"),
            device=e.text("DEVICE", d.device),
            dtype=e.text("DTYPE", d.dtype),
            limits=replace(d.limits,
                           max_sessions=_env_sessions(e, d.limits.max_sessions),
                           max_new_tokens=e.integer("MAX_NEW_TOKENS", d.limits.max_new_tokens)),
            kv_cache_gb=e.optional_number("KV_CACHE_GB"),
            kv_memory_fraction=e.number("KV_MEMORY_FRACTION", d.kv_memory_fraction),
            max_seq_len=e.optional_integer("MAX_SEQ_LEN"),
            kv_layout=e.text("KV_LAYOUT", d.kv_layout),
            engine=e.text("ENGINE", d.engine),
            max_verify_tokens=e.integer("MAX_VERIFY_TOKENS", d.max_verify_tokens),
            verify_width=e.text("VERIFY_WIDTH", d.verify_width),
            prefill_chunk=e.text("PREFILL_CHUNK", d.prefill_chunk),
            mixed_steps=e.switch("MIXED_STEPS", d.mixed_steps),
            prefix_cache_gb=e.number("PREFIX_CACHE_GB", d.prefix_cache_gb),
            batch_invariant=e.switch("BATCH_INVARIANT", d.batch_invariant),
            gil_switch_interval_ms=e.number("GIL_SWITCH_INTERVAL_MS", d.gil_switch_interval_ms),
            gc_freeze=e.switch("GC_FREEZE", d.gc_freeze),
            kv_queue=e.integer("KV_QUEUE", d.kv_queue),
            kv_wait_s=e.number("KV_WAIT_S", d.kv_wait_s),
            session_ttl_s=e.number("SESSION_TTL_S", d.session_ttl_s),
            first_message_timeout_s=e.number("FIRST_MESSAGE_TIMEOUT_S",
                                             d.first_message_timeout_s),
            features_base_timeout_s=e.number("FEATURES_BASE_TIMEOUT_S",
                                             d.features_base_timeout_s),
            input_timeout_s=e.number("INPUT_TIMEOUT_S", d.input_timeout_s),
            max_sessions_per_principal=e.integer("MAX_SESSIONS_PER_PRINCIPAL",
                                                 d.max_sessions_per_principal),
            profile_path=e.path("PROFILE"),
            recalibrate=e.switch("RECALIBRATE", d.recalibrate),
            emulate_prefill_ms=e.number("EMULATE_PREFILL_MS", d.emulate_prefill_ms),
            emulate_step_ms=e.number("EMULATE_STEP_MS", d.emulate_step_ms),
            grace_s=e.number("GRACE_S", d.grace_s),
            drain_timeout_s=e.number("DRAIN_TIMEOUT_S", d.drain_timeout_s),
            seed=e.integer("SEED", d.seed),
            metrics_port=e.optional_integer("METRICS_PORT"),
            metrics_host=e.text("METRICS_HOST", d.metrics_host),
            metrics_principals=e.text("METRICS_PRINCIPALS", d.metrics_principals),
        )

    def check(self) -> None:
        """Refuse at start-up what would otherwise fail every request later.

        ``--max-new-tokens -1`` was accepted and then refused every request; the protocol's
        0 ("the server's default") stays a request-side meaning, never a cap. Raises
        SettingsError naming the flag.
        """
        require_int("--port", self.port, 0, 65535, "0 picks one")
        if self.health_port is not None:
            require_int("--health-port", self.health_port, 0, 65535, "0 picks one")
        if self.metrics_port is not None:
            require_int("--metrics-port", self.metrics_port, 0, 65535, "0 picks one")
        require_choice("--metrics-principals", self.metrics_principals, PRINCIPAL_LABELS)
        require_choice("--dtype", self.dtype, MODEL_DTYPES)
        require_choice("--engine", self.engine, ENGINES)
        lim = self.limits
        require_int("--max-new-tokens", lim.max_new_tokens, 1, _INT32_MAX)
        require_int("--max-sessions", lim.max_sessions, 0, note="0: auto")
        require_int("--max-sessions-per-principal", self.max_sessions_per_principal, 0,
                    note="0: all but one of --max-sessions")
        if self.kv_cache_gb is not None and not (math.isfinite(self.kv_cache_gb)
                                                 and self.kv_cache_gb > 0):
            raise SettingsError(f"--kv-cache-gb must be > 0, got {self.kv_cache_gb:g}")
        require_fraction("--kv-memory-fraction", self.kv_memory_fraction, zero_ok=False)
        if self.max_seq_len is not None:
            require_int("--max-seq-len", self.max_seq_len, 2)
        require_int("--max-verify-tokens", self.max_verify_tokens, 1,
                    lim.max_draft_tokens + 1, "the drafts cap plus one")
        require_choice("--verify-width", self.verify_width, VERIFY_WIDTHS)
        require_choice("--kv-layout", self.kv_layout, KV_LAYOUTS)
        if not (math.isfinite(self.prefix_cache_gb) and self.prefix_cache_gb >= 0):
            raise SettingsError(f"--prefix-cache-gb must be >= 0 (0: off), "
                                f"got {self.prefix_cache_gb:g}")
        try:
            ChunkPolicy.parse(self.prefill_chunk)
        except ValueError as e:
            raise SettingsError(str(e)) from None
        if not (math.isfinite(self.gil_switch_interval_ms)
                and 0 <= self.gil_switch_interval_ms <= 1000):
            raise SettingsError("--gil-switch-interval-ms must be in [0, 1000] (0: Python's "
                                f"own), got {self.gil_switch_interval_ms:g}")
        require_int("--kv-queue", self.kv_queue, 0, 100_000, "0 refuses at once")
        require_seconds("--kv-wait-s", self.kv_wait_s, zero_ok=True)
        for flag, seconds in (("--session-ttl-s", self.session_ttl_s),
                              ("--first-message-timeout-s", self.first_message_timeout_s),
                              ("--features-base-timeout-s", self.features_base_timeout_s),
                              ("--input-timeout-s", self.input_timeout_s)):
            require_seconds(flag, seconds, zero_ok=False)
        for flag, seconds in (("--grace-s", self.grace_s),
                              ("--drain-timeout-s", self.drain_timeout_s)):
            require_seconds(flag, seconds, zero_ok=True)
        for flag, value in (("--emulate-prefill-ms", self.emulate_prefill_ms),
                            ("--emulate-step-ms", self.emulate_step_ms)):
            if not math.isfinite(value) or value < 0:
                raise SettingsError(f"{flag} must be >= 0 (0: off), got {value:g}")
        require_int("--seed", self.seed, 0, SEED_MAX)

    @property
    def per_principal_cap(self) -> int:
        """Sessions one principal may hold: the flag, or all but one of --max-sessions
        (auto: of the most it may come to, until the server resolves it at warm-up)."""
        if self.max_sessions_per_principal > 0:
            return self.max_sessions_per_principal
        return max(1, self.admission_ceiling - 1)

    @property
    def admission_ceiling(self) -> int:
        """The most Generate streams this server may admit, known before its KV is sized
        (for the gRPC server's RPC limit): --max-sessions, or with auto the most it
        can resolve to."""
        if self.limits.max_sessions != AUTO_SESSIONS:
            return self.limits.max_sessions
        return max(CPU_AUTO_SESSIONS, GPU_SESSION_CEILING) + self.kv_queue

    def resolved_profile_path(self, model_id: str) -> Path:
        if self.profile_path is not None:
            return self.profile_path
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_id)
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        paced = ""
        if self.emulate_prefill_ms or self.emulate_step_ms:
            paced = f"-paced{self.emulate_prefill_ms:g}-{self.emulate_step_ms:g}"
        return base / "eventspec" / (f"cloud-{safe}-{self.device}-{self.dtype}-"
                                     f"{self.kernels}{paced}.msgpack")

    @property
    def kernels(self) -> str:
        """What besides the device changes the step's costs, recorded in the profile and
        checked when it is reused: a profile of the default kernels once passed the
        one-session spot check under --batch-invariant and priced its 16-session steps
        1.5x too cheap."""
        return self.engine + ("-invariant" if self.batch_invariant else "")
