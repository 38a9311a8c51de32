"""The settings both nodes declare alike, declared once: where a node binds and runs its
model (``--host``, ``--port``, ``--device``, ``--dtype``, ``--seed``, ``--grace-s``), its
endpoints (``--health-port``, ``--metrics-*``), their checks, reading them from the
environment, and where a node keeps its calibration profile.

Each is a ``settings_fields.setting`` for a field of ``CloudSettings`` or
``EdgeSettings``; the node's own settings stay on its class, in the order its ``--help``
lists them. Torch-free; imports neither node.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Self, cast

from eventspec.shared.node.metric_principals import PRINCIPAL_LABELS
from eventspec.shared.node.node_cli import require_int
from eventspec.shared.node.serving import MODEL_DTYPES
from eventspec.shared.node.settings_fields import check_choices, setting, settings_from_env

# -- where a node binds and what its model runs on -------------------------------------


def host_setting() -> Any:
    """``--host``: loopback unless told otherwise."""
    return setting("127.0.0.1", help="bind address")


def port_setting(default: int) -> Any:
    """``--port``, the node's own default."""
    return setting(default, help="port, 1..65535; 0 picks a free one")


def device_setting() -> Any:
    """``--device``."""
    return setting("cpu", help="cpu, cuda or cuda:N")


def dtype_setting(weights: str) -> Any:
    """``--dtype`` of ``weights`` (the model's, the draft model's)."""
    return setting("float32", choices=MODEL_DTYPES, help=weights)


def seed_setting() -> Any:
    """``--seed`` of ``--model tiny-random``."""
    return setting(0, help="seed of --model tiny-random's random weights")


def grace_setting(calls: str) -> Any:
    """``--grace-s``: how long ``calls`` (requests, Asks) in flight may finish on SIGTERM."""
    return setting(5.0, help=f"on SIGTERM, how long {calls} in flight may finish before they "
                             "are cancelled")


# -- the endpoint settings ---------------------------------------------------------------

def health_port_setting() -> Any:
    """``--health-port``: grpc.health.v1 alone on its own plaintext port, for probes."""
    return setting(None, endpoint=True,
                   help="also serve grpc.health.v1 (only) on this port, plaintext and without "
                        "credentials, for Kubernetes probes: its own server, which no load or "
                        "stalled stream on the main port can exhaust; 0 picks one")


def metrics_port_setting() -> Any:
    """``--metrics-port`` (eventspec.shared.node.metrics); default off."""
    return setting(None, endpoint=True,
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (0 picks a "
                        "free port, logged; default: off)")


def metrics_host_setting() -> Any:
    """``--metrics-host``: loopback unless told otherwise."""
    return setting("127.0.0.1", endpoint=True,
                   help="bind address of the metrics endpoint (it has no authentication: a "
                        "non-loopback address is logged as a warning)")


def metrics_principals_setting() -> Any:
    """``--metrics-principals``, for a node whose series carry callers' principals: only
    the cloud's do (its per-edge series), so only it declares one; the edge's metrics name
    no caller, and a flag there would change nothing
    (``eventspec.shared.node.metric_principals``, which says why the default is name)."""
    return setting("name", endpoint=True, choices=PRINCIPAL_LABELS,
                   help="how /metrics' per-edge series show the authenticated caller: "
                        "its name; hash: the first 12 hex digits of the name's SHA-256 "
                        "(stable across restarts and replicas); none: every caller as "
                        "'redacted'")


def check_ports(settings: Any) -> None:
    """The checks every node's ``check()`` starts with: each setting declared with
    ``choices`` holds one of them, and ``--port`` / ``--health-port`` / ``--metrics-port``
    are ports. SettingsError naming the flag."""
    check_choices(settings)
    require_int("--port", settings.port, 0, 65535, "0 picks one")
    if settings.health_port is not None:
        require_int("--health-port", settings.health_port, 0, 65535, "0 picks one")
    if settings.metrics_port is not None:
        require_int("--metrics-port", settings.metrics_port, 0, 65535, "0 picks one")


class FromEnv:
    """A node's settings class read from the environment: ``ENV_PREFIX`` names its
    variables (``EVENTSPEC_CLOUD_`` + ``SESSION_TTL_S`` for ``--session-ttl-s``)."""

    ENV_PREFIX: ClassVar[str]

    @classmethod
    def from_env(cls) -> Self:
        """Defaults overridden by ``<ENV_PREFIX>*`` environment variables, one per flag
        (the security ones are read by ``eventspec.shared.wire.flags``).

        Raises SettingsError naming the variable when one does not parse.
        """
        return cast(Self, settings_from_env(cast(Any, cls), cls.ENV_PREFIX))


def profile_path(given: Path | None, node: str, model_id: str, *parts: str) -> Path:
    """``--profile`` (``given``), or ``$XDG_CACHE_HOME/eventspec/<node>-<model>-<parts>
    .msgpack``: one calibration profile per model and whatever else changes its costs
    (``parts``: device, dtype, engine...), the model id made safe for a file name."""
    if given is not None:
        return given
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_id)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "eventspec" / f"{'-'.join((node, safe, *parts))}.msgpack"
