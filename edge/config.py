"""The edge node's settings: one object, built from CLI flags and environment, passed down."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from shared.wire.security import ClientSecurity, ServerSecurity


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
    device: str = "cpu"
    dtype: str = "float32"
    default_jpeg_quality: int = 90
    #: Deadline for one request's Generate stream to the cloud.
    request_timeout_s: float = 120.0
    #: Deadline for GetServerInfo and other unary calls.
    rpc_timeout_s: float = 5.0
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

    @staticmethod
    def from_env() -> EdgeSettings:
        """Defaults overridden by EVENTSPEC_EDGE_* environment variables."""
        env = os.environ.get
        return EdgeSettings(
            cloud=env("EVENTSPEC_EDGE_CLOUD"),
            source=env("EVENTSPEC_EDGE_SOURCE", "toy"),
            model=env("EVENTSPEC_EDGE_MODEL", "toy"),
            host=env("EVENTSPEC_EDGE_HOST", "127.0.0.1"),
            port=int(env("EVENTSPEC_EDGE_PORT", "50062")),
            device=env("EVENTSPEC_EDGE_DEVICE", "cpu"),
        )
