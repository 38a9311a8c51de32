"""Security settings of a server and of a client, and the start-up rules they obey.

Pure data (no grpc import) so node settings can hold them. The rules, checked before a
server binds: a non-loopback address needs TLS and an authentication method (tokens or
required client certificates) unless ``--insecure`` says otherwise; client-certificate
auth needs a CA; ports are 0..65535.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

CLIENT_AUTH_CHOICES = ("none", "require")


class SecurityConfigError(ValueError):
    """A server or client was configured in a way that is unsafe or cannot work."""


@dataclass(frozen=True)
class ServerTls:
    """PEM files for a TLS server; ``client_auth`` "require" makes it mutual TLS."""

    cert: Path
    key: Path
    ca: Path | None = None
    client_auth: str = "none"


@dataclass(frozen=True)
class ServerSecurity:
    """How a server authenticates callers (see ``eventspec.shared.wire.auth``) and protects the
    wire."""

    tls: ServerTls | None = None
    #: A file of ``NAME:TOKEN`` lines, re-read when it changes (rotation).
    token_file: Path | None = None
    #: Named tokens given inline (``NAME:TOKEN,...`` from the environment).
    tokens: tuple[tuple[str, str], ...] = ()
    #: Principals (token names or certificate SANs) allowed in; empty = any authenticated.
    allow_principals: frozenset[str] = field(default_factory=frozenset)
    #: Allow plaintext and anonymous callers on a non-loopback address.
    insecure: bool = False
    reflection: bool = True

    @property
    def requires_auth(self) -> bool:
        client_certs = self.tls is not None and self.tls.client_auth == "require"
        return bool(self.token_file or self.tokens or client_certs)


@dataclass(frozen=True)
class ClientSecurity:
    """How a client reaches a server: TLS (``ca`` None = system roots) and a bearer token."""

    tls: bool = False
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    #: The name to verify the server's certificate against, when it differs from the
    #: target's host (an IP address list, a test CA's "localhost").
    server_name: str | None = None
    token: str | None = None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to bind) is reachable only from this machine."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def check_server_start(host: str, port: int, security: ServerSecurity) -> None:
    """Refuse a configuration that would expose the service; the message says why."""
    if not 0 <= port <= 65535:
        raise SecurityConfigError(f"--port {port} is out of range: use 0..65535 (0 picks one)")
    tls = security.tls
    if tls is not None:
        if tls.client_auth not in CLIENT_AUTH_CHOICES:
            choices = ", ".join(CLIENT_AUTH_CHOICES)
            raise SecurityConfigError(
                f"--tls-client-auth {tls.client_auth!r}: use one of {choices}"
            )
        if tls.client_auth == "require" and tls.ca is None:
            raise SecurityConfigError(
                "--tls-client-auth require needs --tls-ca (the CA that signs client certificates)"
            )
    if is_loopback(host) or security.insecure:
        return
    if tls is None:
        raise SecurityConfigError(
            f"refusing to serve plaintext on non-loopback address {host!r}: pass --tls-cert and "
            "--tls-key (and --tls-ca) to use TLS, or --insecure to accept plaintext explicitly"
        )
    if not security.requires_auth:
        raise SecurityConfigError(
            f"refusing to serve anonymous callers on non-loopback address {host!r}: pass "
            "--token-file (or the TOKENS environment variable) or --tls-client-auth require, "
            "or --insecure to accept anonymous callers explicitly"
        )
