#!/usr/bin/env python3
"""A tiny grpc.health.v1 probe for container HEALTHCHECKs and systemd/ops scripts.

    python grpc_health_probe.py [ADDR] [--port-env VAR] [--service NAME] [--timeout SECONDS]
                                [--tls-env PREFIX | --tls-ca CA [--tls-cert C --tls-key K]]
                                [--tls-server-name NAME]

ADDR is HOST:PORT (default 127.0.0.1:50061); ``--port-env VAR`` takes the port from
the environment variable VAR instead (e.g. EVENTSPEC_CLOUD_PORT), so a Dockerfile
HEALTHCHECK in exec form follows the port the server was configured with.

TLS: health needs no token, but a TLS port needs the handshake. ``--tls-env
EVENTSPEC_CLOUD_`` reads the server's own settings: when ``EVENTSPEC_CLOUD_TLS_CERT`` is
set, the probe speaks TLS, trusts ``..._TLS_CA`` and, for mutual TLS, presents the
server's own certificate and key (issue it for both server and client auth), and checks
the name ``localhost`` (put it in the certificate's SANs) unless ``--tls-server-name``.

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


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as fh:
        return fh.read()


def open_channel(addr: str, ca: str | None, cert: str | None, key: str | None,
                 server_name: str | None) -> grpc.Channel:
    """Plaintext without ``ca``/``cert``; else TLS (mutual with ``cert`` and ``key``)."""
    if not (ca or cert):
        return grpc.insecure_channel(addr)
    creds = grpc.ssl_channel_credentials(_read(ca), _read(key), _read(cert))
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(addr, creds, options=options)


def probe(addr: str, service: str, timeout_s: float, channel: grpc.Channel | None = None) -> int:
    """Return the exit status for one Check call against ``addr``."""
    with channel or grpc.insecure_channel(addr) as channel:
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
    parser.add_argument("--tls-env", metavar="PREFIX",
                        help="take TLS files from the server's $PREFIXTLS_CERT/_KEY/_CA")
    parser.add_argument("--tls-ca", help="PEM CA of the server's certificate")
    parser.add_argument("--tls-cert", help="PEM client certificate (mutual TLS)")
    parser.add_argument("--tls-key", help="PEM key of --tls-cert")
    parser.add_argument("--tls-server-name", help="DNS name in the server's certificate")
    args = parser.parse_args(argv)
    ca, cert, key = args.tls_ca, args.tls_cert, args.tls_key
    if args.tls_env and os.environ.get(f"{args.tls_env}TLS_CERT"):
        env = os.environ.get
        ca = ca or env(f"{args.tls_env}TLS_CA")
        cert = cert or env(f"{args.tls_env}TLS_CERT")
        key = key or env(f"{args.tls_env}TLS_KEY")
        args.tls_server_name = args.tls_server_name or "localhost"
    addr = args.addr
    if args.port_env:
        port = os.environ.get(args.port_env, "")
        if not port.isdigit():
            parser.error(f"${args.port_env} is {port!r}, not a port number")
        addr = f"{addr.rsplit(':', 1)[0]}:{port}"
    try:
        channel = open_channel(addr, ca, cert, key, args.tls_server_name)
    except OSError as exc:
        print(f"{addr}: cannot read TLS files: {exc}", file=sys.stderr)
        return 2
    return probe(addr, args.service, args.timeout, channel)


if __name__ == "__main__":
    sys.exit(main())
