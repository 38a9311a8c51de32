"""Command-line flags (with environment defaults) for server and client security.

Both nodes take the same server flags; the edge's link to the cloud and ``eventspec
ask`` take the client flags. Secrets never travel as flag values (they would show in
``ps``): tokens come from files or environment variables.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from eventspec.shared.wire.auth import parse_tokens
from eventspec.shared.wire.channel import read_token
from eventspec.shared.wire.security import (
    CLIENT_AUTH_CHOICES,
    ClientSecurity,
    SecurityConfigError,
    ServerSecurity,
    ServerTls,
)


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def add_server_security_args(parser: argparse.ArgumentParser, env_prefix: str) -> None:
    """``--tls-*``, ``--token-file``, ``--allow-principal``, ``--insecure``, ``--no-reflection``."""
    env = os.environ.get
    p = env_prefix
    g = parser.add_argument_group("network security")
    g.add_argument("--tls-cert", default=env(f"{p}TLS_CERT"),
                   help=f"PEM certificate chain of this server (${p}TLS_CERT)")
    g.add_argument("--tls-key", default=env(f"{p}TLS_KEY"),
                   help=f"PEM private key of --tls-cert (${p}TLS_KEY)")
    g.add_argument("--tls-ca", default=env(f"{p}TLS_CA"),
                   help=f"PEM CA that signs client certificates (${p}TLS_CA)")
    g.add_argument("--tls-client-auth", choices=CLIENT_AUTH_CHOICES,
                   default=env(f"{p}TLS_CLIENT_AUTH", "none"),
                   help="require: mutual TLS, clients must present a certificate signed by "
                        f"--tls-ca; its first SAN is the principal (${p}TLS_CLIENT_AUTH)")
    g.add_argument("--token-file", default=env(f"{p}TOKEN_FILE"),
                   help="file of NAME:TOKEN lines; callers send 'authorization: Bearer TOKEN'; "
                        f"re-read when it changes (${p}TOKEN_FILE; inline: ${p}TOKENS="
                        "NAME:TOKEN,...)")
    g.add_argument("--allow-principal", action="append", metavar="NAME",
                   default=[n for n in env(f"{p}ALLOW_PRINCIPALS", "").split(",") if n],
                   help="allow only these token names / certificate SANs (repeatable; "
                        f"default: any authenticated caller) (${p}ALLOW_PRINCIPALS)")
    g.add_argument("--insecure", action="store_true", default=_truthy(env(f"{p}INSECURE")),
                   help="allow plaintext and anonymous callers on a non-loopback --host "
                        f"(${p}INSECURE=1)")
    g.add_argument("--no-reflection", action="store_true",
                   default=env(f"{p}REFLECTION", "1") == "0",
                   help=f"do not serve gRPC server reflection (${p}REFLECTION=0)")


def server_security_from_args(args: argparse.Namespace, env_prefix: str) -> ServerSecurity:
    """The ``ServerSecurity`` those flags describe; errors name the flag."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SystemExit("--tls-cert and --tls-key go together")
    tls = None
    if args.tls_cert:
        tls = ServerTls(Path(args.tls_cert), Path(args.tls_key), _path(args.tls_ca),
                        args.tls_client_auth)
    elif args.tls_client_auth != "none" or args.tls_ca:
        raise SystemExit("--tls-ca / --tls-client-auth need --tls-cert and --tls-key")
    inline = os.environ.get(f"{env_prefix}TOKENS", "")
    try:
        tokens = parse_tokens(inline.split(","), f"${env_prefix}TOKENS")
    except SecurityConfigError as exc:
        raise SystemExit(str(exc)) from None
    return ServerSecurity(
        tls=tls,
        token_file=_path(args.token_file),
        tokens=tuple(tokens.items()),
        allow_principals=frozenset(args.allow_principal or ()),
        insecure=args.insecure,
        reflection=not args.no_reflection,
    )


def add_client_security_args(parser: argparse.ArgumentParser, *, prefix: str,
                             env_prefix: str, peer: str) -> None:
    """``--{prefix}tls``, ``--{prefix}tls-ca/-cert/-key/-server-name``, ``--{prefix}token-file``."""
    env = os.environ.get
    f, p = f"--{prefix}", env_prefix
    parser.add_argument(f"{f}tls", action="store_true", default=_truthy(env(f"{p}TLS")),
                        help=f"use TLS to the {peer} (implied by {f}tls-ca/-cert) (${p}TLS=1)")
    parser.add_argument(f"{f}tls-ca", default=env(f"{p}TLS_CA"),
                        help=f"PEM CA that signs the {peer}'s certificate (default: the system's) "
                             f"(${p}TLS_CA)")
    parser.add_argument(f"{f}tls-cert", default=env(f"{p}TLS_CERT"),
                        help=f"PEM client certificate for mutual TLS (${p}TLS_CERT)")
    parser.add_argument(f"{f}tls-key", default=env(f"{p}TLS_KEY"),
                        help=f"PEM key of {f}tls-cert (${p}TLS_KEY)")
    parser.add_argument(f"{f}tls-server-name", default=env(f"{p}TLS_SERVER_NAME"),
                        help=f"name to verify in the {peer}'s certificate, when not the "
                             f"address's host (${p}TLS_SERVER_NAME)")
    parser.add_argument(f"{f}token-file", default=env(f"{p}TOKEN_FILE"),
                        help=f"file holding the bearer token for the {peer} (${p}TOKEN_FILE; "
                             f"inline: ${p}TOKEN)")


def client_security_from_args(args: argparse.Namespace, *, prefix: str,
                              env_prefix: str) -> ClientSecurity | None:
    """The ``ClientSecurity`` those flags describe, or None for plaintext without a token."""
    a = prefix.replace("-", "_")

    def get(name: str) -> str | None:
        value: str | None = getattr(args, f"{a}{name}")
        return value

    try:
        token = read_token(_path(get("token_file")), os.environ.get(f"{env_prefix}TOKEN"),
                           f"--{prefix}token-file")
    except SecurityConfigError as exc:
        raise SystemExit(str(exc)) from None
    tls = bool(getattr(args, f"{a}tls") or get("tls_ca") or get("tls_cert"))
    if not tls and token is None:
        return None
    return ClientSecurity(tls=tls, ca=_path(get("tls_ca")), cert=_path(get("tls_cert")),
                          key=_path(get("tls_key")), server_name=get("tls_server_name"),
                          token=token)
