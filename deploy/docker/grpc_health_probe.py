#!/usr/bin/env python3
"""A tiny grpc.health.v1 probe for container HEALTHCHECKs and systemd/ops scripts.

    python grpc_health_probe.py [ADDR] [--port-env VAR] [--service NAME] [--timeout SECONDS]

ADDR is HOST:PORT (default 127.0.0.1:50061); ``--port-env VAR`` takes the port from
the environment variable VAR instead (e.g. EVENTSPEC_CLOUD_PORT), so a Dockerfile
HEALTHCHECK in exec form follows the port the server was configured with.

Exit status: 0 when the server reports SERVING, 1 when it answers anything else
(NOT_SERVING during warm-up and shutdown), 2 when it cannot be reached or the call fails.
Both eventspec servers report the overall status under the service name "" and under
their own service (eventspec.v1.Verifier or eventspec.v1.EdgeAgent).

Uses only grpcio and grpcio-health-checking, which the eventspec package depends on.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def probe(addr: str, service: str, timeout_s: float) -> int:
    """Return the exit status for one Check call against ``addr``."""
    with grpc.insecure_channel(addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            print(f"{addr}: health check failed: {code}", file=sys.stderr)
            return 2
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{addr} {service or '(server)'}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("addr", nargs="?", default="127.0.0.1:50061", help="HOST:PORT")
    parser.add_argument("--port-env", metavar="VAR", help="read the port from $VAR (host of ADDR)")
    parser.add_argument("--service", default="", help='service name ("" = the whole server)')
    parser.add_argument("--timeout", type=float, default=3.0, help="deadline in seconds")
    args = parser.parse_args(argv)
    addr = args.addr
    if args.port_env:
        port = os.environ.get(args.port_env, "")
        if not port.isdigit():
            parser.error(f"${args.port_env} is {port!r}, not a port number")
        addr = f"{addr.rsplit(':', 1)[0]}:{port}"
    return probe(addr, args.service, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
