"""TLS credentials from PEM files, for servers (reloaded without a restart) and clients.

Servers use gRPC's dynamic SSL credentials: the fetcher runs at every new handshake, so
a certificate renewed on disk (cert-manager, a cron job) is picked up by the next
connection, and a SIGHUP forces a re-read even when modification times did not change.
A broken replacement is logged and the previous certificate kept: a bad renewal must
not take the service down. Established connections keep their session.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import grpc

from eventspec.shared.wire.security import ClientSecurity, SecurityConfigError, ServerTls

log = logging.getLogger(__name__)

_PEM_MARKERS = {"certificate": b"-----BEGIN CERTIFICATE-----", "key": b"PRIVATE KEY-----"}


def read_pem(path: Path, kind: str, flag: str) -> bytes:
    """The bytes of a PEM file, or an error naming the flag and the file."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"{flag} {path}: cannot read: {exc.strerror}") from exc
    if _PEM_MARKERS[kind] not in data:
        raise SecurityConfigError(f"{flag} {path}: not a PEM {kind} file")
    return data


def _mtimes(tls: ServerTls) -> tuple[float, ...]:
    paths = [tls.cert, tls.key] + ([tls.ca] if tls.ca is not None else [])
    out = []
    for p in paths:
        try:
            out.append(p.stat().st_mtime)
        except OSError:
            out.append(-1.0)
    return tuple(out)


class ReloadingServerCredentials:
    """Server credentials whose certificate, key and CA are re-read when they change."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._forced = False
        self._stamp = _mtimes(tls)
        self._initial = self._load()
        self.reloads = 0

    def _load(self) -> grpc.ServerCertificateConfiguration:
        t = self.tls
        chain = read_pem(t.cert, "certificate", "--tls-cert")
        key = read_pem(t.key, "key", "--tls-key")
        ca = read_pem(t.ca, "certificate", "--tls-ca") if t.ca is not None else None
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=ca)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._initial, self._fetch,
            require_client_authentication=self.tls.client_auth == "require",
        )

    def request_reload(self) -> None:
        """Re-read the files at the next handshake (SIGHUP)."""
        with self._lock:
            self._forced = True

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC at each handshake: a new configuration, or None for no change."""
        with self._lock:
            stamp = _mtimes(self.tls)
            if not self._forced and stamp == self._stamp:
                return None
            self._forced = False
            self._stamp = stamp
            try:
                config = self._load()
            except SecurityConfigError as exc:
                log.error("TLS reload failed, keeping the previous certificate: %s", exc)
                return None
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self.tls.cert)
            return config


def channel_credentials(sec: ClientSecurity) -> grpc.ChannelCredentials:
    """TLS channel credentials; with ``cert``/``key`` the client proves its identity (mTLS)."""
    if (sec.cert is None) != (sec.key is None):
        raise SecurityConfigError("a client certificate needs both --tls-cert and --tls-key")
    ca = read_pem(sec.ca, "certificate", "--tls-ca") if sec.ca is not None else None
    key = read_pem(sec.key, "key", "--tls-key") if sec.key is not None else None
    cert = read_pem(sec.cert, "certificate", "--tls-cert") if sec.cert is not None else None
    return grpc.ssl_channel_credentials(ca, key, cert)


def client_channel_options(sec: ClientSecurity) -> list[tuple[str, str]]:
    """Channel options for TLS: the name to check the server's certificate against."""
    if sec.tls and sec.server_name:
        return [("grpc.ssl_target_name_override", sec.server_name)]
    return []
