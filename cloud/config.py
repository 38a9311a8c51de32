"""The cloud node's settings: one object, built from CLI flags and environment, passed down."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from eventspec.cloud.requests.session_capacity import (
    AUTO_SESSIONS,
    CPU_AUTO_SESSIONS,
    GPU_SESSION_CEILING,
    parse_max_sessions,
)
from eventspec.cloud.requests.timeouts import (
    FEATURES_BASE_TIMEOUT_S,
    FEATURES_MAX_TIMEOUT_S,
    FIRST_MESSAGE_TIMEOUT_S,
)
from eventspec.cloud.scheduling.prefill_chunking import ChunkPolicy
from eventspec.cloud.speculation.sit_out import SitOut
from eventspec.shared.contract.errors import InvalidInput
from eventspec.shared.contract.types import ServerLimits
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
    metrics_principals_setting,
    port_setting,
    profile_path,
    seed_setting,
)
from eventspec.shared.node.settings_fields import Setting, nested, setting
from eventspec.shared.node.static.linear_dtypes import LINEAR_DTYPES
from eventspec.shared.wire.security import ServerSecurity

__all__ = ["ENV_PREFIX", "CloudSettings", "SettingsError"]

#: Every flag ``--some-flag`` of ``eventspec-cloud serve`` has the variable
#: ``EVENTSPEC_CLOUD_SOME_FLAG`` (``eventspec.shared.node.node_cli``).
ENV_PREFIX = "EVENTSPEC_CLOUD_"
#: ``--engine`` choices.
ENGINES = ("auto", "static", "hf")
#: ``--verify-width`` choices.
VERIFY_WIDTHS = ("auto", "all")
#: ``--kv-layout`` choices.
KV_LAYOUTS = ("by-length", "slots")
#: The wire's ``GenerationConfig.max_new_tokens`` is an int32.
_INT32_MAX = 2**31 - 1
#: ``--seed`` spans what ``torch.manual_seed`` takes.
SEED_MAX = 2**64 - 1


@dataclass(frozen=True)
class CloudSettings(FromEnv):
    """Everything the verifier needs to start; see ``eventspec-cloud serve --help``.

    Each setting is declared once, here (those both nodes have alike, in
    ``eventspec.shared.node.node_settings``): its field's ``setting`` is its flag, its
    ``EVENTSPEC_CLOUD_*`` variable (``from_env``) and its help
    (``eventspec.shared.node.settings_fields``).
    """

    ENV_PREFIX = ENV_PREFIX

    model: str = setting(
        "toy", help="a local Video-LLaVA-7B-hf directory, toy (the embedded toy-world "
                    "model) or tiny-random")
    host: str = host_setting()
    port: int = port_setting(50061)
    device: str = device_setting()
    dtype: str = dtype_setting("the model's weights")
    #: ``limits.max_sessions`` 0 is ``--max-sessions auto``
    #: (``eventspec.cloud.requests.session_capacity``).
    limits: ServerLimits = nested(
        lambda: ServerLimits(max_sessions=AUTO_SESSIONS),
        max_sessions=Setting(
            parse=parse_max_sessions,
            help="concurrent Generate streams; more get RESOURCE_EXHAUSTED. auto (0): as many "
                 "as run at once (on a GPU what the KV holds at the default answer cap, at "
                 "most 64; on a CPU 8) plus --kv-queue waiting for KV"),
        max_new_tokens=Setting(
            help="cap on a request's max_new_tokens (>= 1; a request's 0 means min(64, this "
                 "cap))"))
    #: 0: all but one of ``limits.max_sessions`` (at least 1), so one caller always leaves
    #: a slot free.
    max_sessions_per_principal: int = setting(
        0, help="concurrent Generate streams one authenticated caller (token name or "
                "certificate) may hold; more get RESOURCE_EXHAUSTED. 0: all but one of "
                "--max-sessions, so one caller always leaves a slot free")
    #: None: a fraction of free device memory, or a CPU default.
    kv_cache_gb: float | None = setting(
        None, help="KV memory budget in GiB: by length, an arena of budget / (KV bytes per "
                   "token) positions less one --max-seq-len for padding; with slots, budget "
                   "/ (max-seq-len x KV bytes per token) slots, at most --max-sessions "
                   "(default: --kv-memory-fraction of free GPU memory, or 2 GiB on CPU). "
                   "The KV alone: --prefill-dtype fp8's weight copy and --prefix-cache-gb "
                   "come on top of it (the default budget leaves room for them)")
    #: "by-length": each request takes KV for its own prompt plus its answer cap from one
    #: arena (``eventspec.cloud.scheduling.kv_arena``; the static engine); "slots": every request a
    #: slot of ``max_seq_len`` positions (the HF engine always).
    kv_layout: str = setting(
        "by-length", choices=KV_LAYOUTS,
        help="by-length: a request takes KV for its own prompt plus its answer cap, so "
             "short requests leave room for more (static engine); slots: every request a "
             "slot of --max-seq-len positions (the HF engine always)")
    #: Fraction of free device memory reserved for KV when ``kv_cache_gb`` is None (CUDA).
    kv_memory_fraction: float = setting(
        0.9, help="without --kv-cache-gb, the share of free GPU memory the KV budget takes, "
                  "in (0, 1]")
    #: None = the prompt, 256 question tokens and the answer cap, at most the model's
    #: (``eventspec.cloud.engine.kv.auto_max_seq_len``).
    max_seq_len: int | None = setting(
        None, help="positions per KV slot, prompt plus answer (default: the prompt's template "
                   "and video rows, 256 question tokens and --max-new-tokens, at most the "
                   "model's; a longer question gets a smaller answer cap, stated in its Plan)")
    engine: str = setting(
        "auto", choices=ENGINES,
        help="static: static KV slots + CUDA graphs; hf: the HF eager reference; auto: "
             "static on CUDA, hf on CPU; a model the static engine cannot serve falls back "
             "to hf, logged")
    max_verify_tokens: int = setting(
        33, help="widest verify step of one request: the last committed token plus up to "
                 "this many minus one drafts (advertised to the edge, which drafts no "
                 "further ahead)")
    #: "auto" prices drafts with eventspec.shared.contract.verify_width's cost model.
    verify_width: str = setting(
        "auto", choices=VERIFY_WIDTHS,
        help="auto: each step verifies, per session, the drafts that maximise the batch's "
             "expected tokens per ms under the cost model and the measured acceptance; "
             "all: every valid draft up to --max-verify-tokens")
    #: SpecEdge's policy for a dry session in a loaded batch (``cloud/speculation/sit_out.py``).
    sit_out: str = setting(
        "off", help="a speculating session with no drafts when a step starts, whose drafts "
                    "are on their way, sits that step out (at most one in a row) while at "
                    "least N sessions run: off, auto (N = 8) or N >= 2 (off: it did not pay "
                    "on the static engine at 16 sessions, docs/results/e2e-gpu.md)")
    #: Chunked prefill, decode first (``eventspec.cloud.scheduling.prefill_chunking``). 512: on an
    #: H100, 512-token chunks riding graphed mixed steps kept ITL p99 under 50 ms up to 8
    #: requests/s, where whole prompts missed it at every rate
    #: (``load-h100-graphed-capacity.json``).
    prefill_chunk: str = setting(
        "512", help="chunked prefill, decode first (static engine): off (whole prompts), auto "
                    "(each iteration prefills about one step's worth of prompt tokens, from "
                    "the cost model, at least 1,024), a number of tokens per iteration, or "
                    "slack[:R[:PACE]] (pieces of 64-512 rows sized from the measured step "
                    "times: as small as writes every prompt within PACE ms of its arrival, "
                    "default 200, 0 off, and so a step with a piece stays within R times "
                    "one without, R > 1, default 1.5); on a GPU a number or slack gets "
                    "CUDA graphs of the step with its chunks (auto runs them eagerly); "
                    "with --batch-invariant the chunks run in calls of their own, and off "
                    "is faster")
    #: ``eventspec.shared.node.static.fp8``: E4M3 GEMMs for prefill calls of their own;
    #: decode and verify rows stay in the model's dtype (fp8 steps were slower on an H200:
    #: ``fp8-prefill-full-h200.json``'s ``steps``, so no flag offers them).
    prefill_dtype: str = setting(
        "model", choices=LINEAR_DTYPES,
        help="model: prefill in the model's dtype; fp8: a prompt's linear layers as E4M3 "
             "GEMMs on fp8 copies of the weights (static engine on a GPU of compute "
             "capability 8.9+, bfloat16; +1 byte a parameter; not with --batch-invariant). "
             "Faster prefill, and later tokens may differ from a bf16 prefill's: "
             "docs/results/engine-gpu.md measures both")
    #: Saved prompt prefixes (``eventspec.cloud.scheduling.prefix_cache``); taken out of the
    #: default KV budget, on top of an explicit one.
    prefix_cache_gb: float = setting(
        0.0, help="GiB of device memory for saved prompt prefixes, taken out of the "
                  "default KV budget (on top of an explicit --kv-cache-gb): a question "
                  "about a clip already asked about skips the video prefill (static engine; "
                  "0: off)")
    mixed_steps: bool = setting(
        True, on_off=True,
        help="with --prefill-chunk, run the chunks inside the decoding sessions' step (one "
             "forward, static engine; not with --batch-invariant); off: a call of their own")
    #: ``eventspec.cloud.engine.ahead``: the tower beside the steps, not inside one.
    towers_ahead: bool = setting(
        True, on_off=True,
        help="with --prefill-chunk, run a new prompt's video tower on a side CUDA stream "
             "beside the steps, its first piece waiting for it while sessions decode "
             "(static engine); off: inside the step that carries its first piece")
    #: ``eventspec.shared.node.static.invariant``: unfused and without CUDA graphs, so slow
    #: on a GPU (not measured there yet).
    batch_invariant: bool = setting(
        False, help="batch-invariant arithmetic: a greedy answer's logits do not depend on "
                    "who else is in the batch, so speculative equals target-only at any load "
                    "(static engine; on CUDA, batch-invariant Triton kernels with CUDA graphs)")
    #: The engine thread gives up the GIL at every torch call and waits up to this long to
    #: get it back from the gRPC event loop (``eventspec.cloud.scheduling.engine_loop``).
    gil_switch_interval_ms: float = setting(
        0.1, help="the interpreter's thread switch interval while serving (0: Python's 5 ms); "
                  "the engine thread waits up to this long for the GIL after each torch call "
                  "while gRPC work holds it")
    #: ``eventspec.cloud.process.gc_freeze``.
    gc_freeze: bool = setting(
        True, on_off=True,
        help="once warm, freeze the garbage collector's view of the heap (gc.freeze), so its "
             "full passes skip the model and the engine instead of pausing the loop")
    kv_queue: int = setting(
        64, help="requests that may wait, first come first served, for a KV slot when all "
                 "are taken (0: refuse at once with RESOURCE_EXHAUSTED)")
    kv_wait_s: float = setting(
        30.0, help="the longest a request waits in that queue; its own deadline may end the "
                   "wait sooner (RESOURCE_EXHAUSTED then says so)")
    #: None = under ~/.cache/eventspec (``resolved_profile_path``).
    profile_path: Path | None = setting(
        None, flag="--profile",
        help="calibration profile file: reused at the next start when it matches the model "
             "and device, which skips calibration (default: ~/.cache/eventspec/...)")
    recalibrate: bool = setting(
        False, help="measure the cost model afresh even if a saved profile matches")
    #: Pacing (0 = off) to rehearse a slower cloud; see cloud/engine/paced.py.
    emulate_prefill_ms: float = setting(
        0.0, help="pace each prefill to at least this long, to rehearse a slower cloud (e.g. "
                  "200); output is unchanged")
    emulate_step_ms: float = setting(
        0.0, help="pace each decode/verify step to at least this long (e.g. 30, an A100-class "
                  "7B step)")
    #: Released by the sweeper.
    session_ttl_s: float = setting(
        600.0, help="a session older than this is released (a leak guard; longer than any "
                    "request should take)")
    #: ``eventspec.cloud.requests.timeouts`` (and ``features_timeout_s`` for the next two).
    first_message_timeout_s: float = setting(
        FIRST_MESSAGE_TIMEOUT_S,
        help="a Generate call that sends no Open this long after it starts ends with "
             "DEADLINE_EXCEEDED")
    features_base_timeout_s: float = setting(
        FEATURES_BASE_TIMEOUT_S,
        help="aligned features must arrive within this plus the time their declared size "
             "takes over the edge's measured uplink (4x slack), and within "
             "--input-timeout-s of Open")
    input_timeout_s: float = setting(
        FEATURES_MAX_TIMEOUT_S,
        help="no aligned-features upload may take longer than this after Open, whatever it "
             "declares")
    drain_timeout_s: float = setting(
        2.0, help="after Done, how long to wait for the edge to close its side of the stream")
    grace_s: float = grace_setting("requests")
    seed: int = seed_setting()
    #: grpc.health.v1 alone on its own plaintext port (None: off), for probes.
    health_port: int | None = health_port_setting()
    #: Prometheus ``/metrics`` over HTTP on this port (0 picks one); None: off.
    metrics_port: int | None = metrics_port_setting()
    metrics_host: str = metrics_host_setting()
    #: How the per-edge series name callers on the unauthenticated /metrics.
    metrics_principals: str = metrics_principals_setting()
    #: TLS, tokens, allowed principals, --insecure, reflection (``eventspec.shared.wire.flags``).
    security: ServerSecurity = field(default_factory=ServerSecurity)

    def sit_out_policy(self) -> SitOut:
        """``--sit-out`` as the scheduler's policy (``eventspec.cloud.speculation.sit_out``)."""
        return SitOut.parse(self.sit_out)

    def check(self) -> None:
        """Refuse at start-up what would otherwise fail every request later.

        ``--max-new-tokens -1`` was accepted and then refused every request; the protocol's
        0 ("the server's default") stays a request-side meaning, never a cap. Raises
        SettingsError naming the flag.
        """
        check_ports(self)
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
        if not (math.isfinite(self.prefix_cache_gb) and self.prefix_cache_gb >= 0):
            raise SettingsError(f"--prefix-cache-gb must be >= 0 (0: off), "
                                f"got {self.prefix_cache_gb:g}")
        if self.fp8_flag and self.batch_invariant:
            raise SettingsError(f"{self.fp8_flag} with --batch-invariant: an fp8 row cannot "
                                "have the model dtype's bits; choose one")
        if self.fp8_flag and self.engine == "hf":
            raise SettingsError(f"{self.fp8_flag} needs the static engine, not --engine hf")
        try:
            ChunkPolicy.parse(self.prefill_chunk)
        except ValueError as e:
            raise SettingsError(str(e)) from None
        try:
            self.sit_out_policy()
        except InvalidInput as e:
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
    def fp8_flag(self) -> str:
        """The flag that asks for fp8 linear layers ("" when none does)."""
        return "--prefill-dtype fp8" if self.prefill_dtype == "fp8" else ""

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
        """``--profile``, or one file per model, device, dtype, kernels and pacing under
        ``$XDG_CACHE_HOME/eventspec``."""
        paced = ""
        if self.emulate_prefill_ms or self.emulate_step_ms:
            paced = f"-paced{self.emulate_prefill_ms:g}-{self.emulate_step_ms:g}"
        return profile_path(self.profile_path, "cloud", model_id, self.device, self.dtype,
                            self.kernels + paced)

    @property
    def kernels(self) -> str:
        """What besides the device changes the step's costs, recorded in the profile and
        checked when it is reused: a profile of the default kernels once passed the
        one-session spot check under --batch-invariant and priced its 16-session steps
        1.5x too cheap."""
        return self.engine + ("-invariant" if self.batch_invariant else "")
