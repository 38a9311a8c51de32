"""The cloud node's settings: one object, built from CLI flags and environment, passed down."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from eventspec.cloud.timeouts import (
    FEATURES_BASE_TIMEOUT_S,
    FEATURES_MAX_TIMEOUT_S,
    FIRST_MESSAGE_TIMEOUT_S,
)
from eventspec.shared.contract.types import ServerLimits
from eventspec.shared.wire.security import ServerSecurity


def _env(name: str, default: str) -> str:
    return os.environ.get(f"EVENTSPEC_CLOUD_{name}", default)


class SettingsError(ValueError):
    """A flag or environment value the verifier cannot run with; the message names it."""


def _env_int(name: str, default: int) -> int:
    text = _env(name, "")
    if text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise SettingsError(f"$EVENTSPEC_CLOUD_{name}={text!r} is not an integer") from None


#: The wire's ``GenerationConfig.max_new_tokens`` is an int32.
_INT32_MAX = 2**31 - 1


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
    limits: ServerLimits = field(default_factory=ServerLimits)
    #: KV memory budget in GiB (None: a fraction of free device memory, or a CPU default).
    kv_cache_gb: float | None = None
    #: Fraction of free device memory reserved for KV when ``kv_cache_gb`` is None (CUDA).
    kv_memory_fraction: float = 0.9
    #: Positions per KV slot (prompt + answer); None = the model's maximum.
    max_seq_len: int | None = None
    #: Target engine: "static" (static KV slots, CUDA graphs), "hf" (the HF eager
    #: reference), or "auto" (static on CUDA, hf on CPU).
    engine: str = "auto"
    #: Widest verify forward: C[-1] plus up to this many minus one drafts.
    max_verify_tokens: int = 33
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
    #: Skip calibration and use a fixed cost model (tests).
    calibrate: bool = True
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

    @staticmethod
    def from_env() -> CloudSettings:
        """Defaults overridden by EVENTSPEC_CLOUD_* environment variables."""
        return CloudSettings(
            model=_env("MODEL", "toy"),
            host=_env("HOST", "127.0.0.1"),
            port=_env_int("PORT", 50061),
            device=_env("DEVICE", "cpu"),
            dtype=_env("DTYPE", "float32"),
        )

    def check(self) -> None:
        """Refuse at start-up what would otherwise fail every request later.

        ``--max-new-tokens -1`` was accepted and then refused every request; the protocol's
        0 ("the server's default") stays a request-side meaning, never a cap. Raises
        SettingsError naming the flag.
        """
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"--port must be in 0..65535 (0 picks one), got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise SettingsError("--metrics-port must be in 0..65535 (0 picks one), got "
                                f"{self.metrics_port}")
        lim = self.limits
        if not 1 <= lim.max_new_tokens <= _INT32_MAX:
            raise SettingsError(f"--max-new-tokens must be in 1..{_INT32_MAX}, got "
                                f"{lim.max_new_tokens}")
        if lim.max_sessions < 1:
            raise SettingsError(f"--max-sessions must be >= 1, got {lim.max_sessions}")
        if self.max_sessions_per_principal < 0:
            raise SettingsError("--max-sessions-per-principal must be >= 0 (0: all but one of "
                                f"--max-sessions), got {self.max_sessions_per_principal}")
        if self.kv_cache_gb is not None and not (math.isfinite(self.kv_cache_gb)
                                                 and self.kv_cache_gb > 0):
            raise SettingsError(f"--kv-cache-gb must be > 0, got {self.kv_cache_gb:g}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise SettingsError(f"--max-seq-len must be >= 2, got {self.max_seq_len}")
        for flag, value in (("--emulate-prefill-ms", self.emulate_prefill_ms),
                            ("--emulate-step-ms", self.emulate_step_ms)):
            if not math.isfinite(value) or value < 0:
                raise SettingsError(f"{flag} must be >= 0 (0: off), got {value:g}")

    @property
    def per_principal_cap(self) -> int:
        """Sessions one principal may hold: the flag, or all but one of --max-sessions."""
        if self.max_sessions_per_principal > 0:
            return self.max_sessions_per_principal
        return max(1, self.limits.max_sessions - 1)

    def resolved_profile_path(self, model_id: str) -> Path:
        if self.profile_path is not None:
            return self.profile_path
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_id)
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        paced = ""
        if self.emulate_prefill_ms or self.emulate_step_ms:
            paced = f"-paced{self.emulate_prefill_ms:g}-{self.emulate_step_ms:g}"
        return base / "eventspec" / f"cloud-{safe}-{self.device}-{self.dtype}{paced}.msgpack"
