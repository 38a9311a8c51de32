"""What both nodes share to export Prometheus metrics: the HTTP endpoint and bounded labels.

Each server owns its own ``CollectorRegistry`` (never the process-wide default), so
several servers in one process (the tests, ``eventspec demo``) keep separate counters,
and ``/metrics`` on one port shows one node. The endpoint is off unless
``--metrics-port`` is given, and binds loopback unless told otherwise: it has no
authentication, so exposing it is an operator's explicit choice.

Metric names follow vLLM's where the meaning is the same, with an ``eventspec:`` prefix
instead of ``vllm:`` (README, "Metrics"). The nodes import this module; the client
(``eventspec ask``) never does, so it starts without ``prometheus_client``.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Sequence
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

#: Every metric's name starts with this (vLLM uses ``vllm:``).
PREFIX = "eventspec:"

#: Most distinct per-edge label values a server keeps; later ones are reported as
#: ``OTHER``, so a fleet of edges (or a misbehaving client) cannot grow the series
#: count without bound.
MAX_EDGE_LABELS = 32
OTHER = "other"

#: Seconds buckets for request-scale latencies (TTFT, queue, e2e, prefill).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                   0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
#: Seconds buckets for per-step and per-token times.
STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.04,
                0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
#: Buckets for counts per engine step (sessions in a batch, tokens in a step).
COUNT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 2048)


class BoundedLabels:
    """Map label values (edge principals) to at most ``limit`` distinct names.

    The first ``limit`` values seen keep their names; any later one becomes ``OTHER``.
    Token names come from the operator's token file, so they are few; certificate SANs
    or peers could be many, and this keeps the series count bounded either way.
    """

    def __init__(self, limit: int = MAX_EDGE_LABELS) -> None:
        self.limit = limit
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._known:
            return value
        with self._lock:
            if value in self._known:
                return value
            if len(self._known) < self.limit:
                self._known.add(value)
                return value
        return OTHER


def metric_name(suffix: str) -> str:
    """``eventspec:<suffix>``."""
    return PREFIX + suffix


class NodeMetrics:
    """What each node's metrics have alike: their own registry (a fresh one by default),
    every metric declared in it under :data:`PREFIX`, and ``auth_failures``, the calls its
    auth interceptor refused, by status."""

    auth_failures: Counter

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()

    def counter(self, suffix: str, help: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(metric_name(suffix), help, labels, registry=self.registry)

    def histogram(self, suffix: str, help: str, labels: Sequence[str] = (), *,
                  buckets: Sequence[float]) -> Histogram:
        return Histogram(metric_name(suffix), help, labels, buckets=buckets,
                         registry=self.registry)

    def gauge(self, suffix: str, help: str) -> Gauge:
        return Gauge(metric_name(suffix), help, registry=self.registry)

    def on_auth_failure(self, code: str) -> None:
        """A call was refused by the auth interceptor (UNAUTHENTICATED, PERMISSION_DENIED)."""
        self.auth_failures.labels(code).inc()


def serve_metrics(metrics: NodeMetrics, auth: Any, host: str, port: int | None
                  ) -> MetricsEndpoint:
    """``/metrics`` for ``metrics`` on ``host:port`` (None or 0: a free one), started;
    ``auth`` (the server's auth interceptor, None without authentication) reports each
    call it refuses to ``metrics``."""
    if auth is not None:
        auth.on_denied = metrics.on_auth_failure
    endpoint = MetricsEndpoint(metrics.registry, host, port or 0)
    endpoint.start()
    return endpoint


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost`` counts)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class MetricsEndpoint:
    """``/metrics`` over plain HTTP for one registry, in a daemon thread.

    Scrapes run on that thread and read counters the servers update; nothing here
    touches the event loop or the engine loop.
    """

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._httpd: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Bind and serve; returns the bound port (``port`` 0 picks a free one)."""
        if not is_loopback(self.host):
            log.warning("metrics on %s:%d are served without authentication to anyone who "
                        "can reach that address", self.host, self.port)
        try:
            self._httpd, self._thread = start_http_server(self.port, self.host, self.registry)
        except OSError as exc:
            raise OSError(f"cannot serve metrics on {self.host}:{self.port} (--metrics-host/"
                          f"--metrics-port): {exc.strerror or exc}") from exc
        self.port = int(self._httpd.server_port)
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)
        return self.port

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
