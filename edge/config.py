"""The edge node's settings: one object, built from CLI flags and environment, passed down."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from eventspec.shared.wire.security import ClientSecurity, ServerSecurity


@dataclass(frozen=True)
class EdgeSettings:
    """Everything the edge agent needs; see ``eventspec-edge serve --help``."""

    cloud: str | None = None
    source: str = "toy"
    allow_pickle: bool = False
    #: (width, height) for files that do not state their sensor size (RAW without a
    #: geometry or known plugin, DAT, bin, txt, npz) and for live streams.
    sensor_size: tuple[int, int] | None = None
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
    #: Asks that may wait for a cloud slot (beyond those in flight) before more are
    #: refused with RESOURCE_EXHAUSTED.
    max_queued_asks: int = 256
    #: Acceptance prior before any request has been observed.
    acceptance_prior: float = 0.5
    #: Send a Preview to the client every N drafted tokens.
    preview_every: int = 4
    #: "auto": draft when the shared timing plan says it pays; "always": draft anyway
    #: (to measure acceptance, or when the cost model is known to be wrong).
    speculation: str = "auto"
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
        """Defaults overridden by EVENTSPEC_EDGE_* environment variables.

        Raises SettingsError naming the variable when one is not a number.
        """
        env = os.environ.get
        return EdgeSettings(
            cloud=env("EVENTSPEC_EDGE_CLOUD") or None,
            source=env("EVENTSPEC_EDGE_SOURCE", "toy"),
            model=env("EVENTSPEC_EDGE_MODEL", "toy"),
            host=env("EVENTSPEC_EDGE_HOST", "127.0.0.1"),
            port=env_int("EVENTSPEC_EDGE_PORT", 50062),
            device=env("EVENTSPEC_EDGE_DEVICE", "cpu"),
            cloud_wait_s=env_float("EVENTSPEC_EDGE_CLOUD_WAIT_S", 60.0),
            cloud_first_reply_s=env_float("EVENTSPEC_EDGE_CLOUD_FIRST_REPLY_S", 5.0),
            max_queued_asks=env_int("EVENTSPEC_EDGE_MAX_QUEUED_ASKS", 256),
        )

    def check(self) -> None:
        """Refuse at start-up what would otherwise fail every request later.

        A negative request timeout, for one, was accepted and then expired every
        request's cloud stream at once. Raises SettingsError naming the flag.
        """
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"--port must be in 0..65535 (0 picks one), got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise SettingsError("--metrics-port must be in 0..65535 (0 picks one), got "
                                f"{self.metrics_port}")
        if not math.isfinite(self.request_timeout_s) or self.request_timeout_s <= 0:
            raise SettingsError(
                f"--request-timeout must be > 0 seconds, got {self.request_timeout_s:g}")
        if not math.isfinite(self.cloud_wait_s) or self.cloud_wait_s < 0:
            raise SettingsError(f"--cloud-wait-s must be >= 0 seconds, got {self.cloud_wait_s:g}")
        if not math.isfinite(self.cloud_first_reply_s) or self.cloud_first_reply_s <= 0:
            raise SettingsError("--cloud-first-reply-s must be > 0 seconds, got "
                                f"{self.cloud_first_reply_s:g}")
        if not 0 <= self.max_queued_asks <= 100_000:
            raise SettingsError(
                f"--max-queued-asks must be in 0..100000, got {self.max_queued_asks}")
        if not 1 <= self.default_jpeg_quality <= 100:
            raise SettingsError(
                f"--jpeg-quality must be in 1..100, got {self.default_jpeg_quality}")
        if self.cloud is not None:
            check_cloud_address(self.cloud)


class SettingsError(ValueError):
    """A flag or environment value the node cannot run with; the message names it."""


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


def env_float(name: str, default: float) -> float:
    """A number from the environment, or SettingsError naming it."""
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        return float(text)
    except ValueError:
        raise SettingsError(f"${name}={text!r} is not a number") from None


def env_int(name: str, default: int) -> int:
    """An integer environment variable, or SettingsError naming it."""
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise SettingsError(f"${name}={text!r} is not an integer") from None
