"""A test PKI made on the fly (trustme): CAs, server and client certificates as PEM files."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import trustme

from eventspec.shared.wire.security import ClientSecurity, ServerSecurity, ServerTls

TOKEN_A = "edge-a-0123456789abcdef0123456789abcdef"
TOKEN_B = "edge-b-fedcba9876543210fedcba9876543210"


@dataclass
class Leaf:
    cert: Path
    key: Path


@dataclass
class Pki:
    """One trusted CA with its leaves, and a second CA nobody trusts."""

    root: Path
    ca: Path
    other_ca: Path
    server: Leaf
    expired_server: Leaf
    client_a: Leaf
    client_b: Leaf
    expired_client: Leaf
    rogue_client: Leaf
    _ca: trustme.CA

    def issue_server(self, name: str, *, other_ca: bool = False) -> Leaf:
        """A fresh server certificate (to test reloads)."""
        ca = trustme.CA() if other_ca else self._ca
        if other_ca:
            ca.cert_pem.write_to_path(str(self.root / f"{name}-ca.pem"))
        return _write(self.root, name, ca.issue_cert("localhost", "127.0.0.1"))


def _write(root: Path, name: str, leaf: trustme.LeafCert) -> Leaf:
    cert, key = root / f"{name}.pem", root / f"{name}.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    return Leaf(cert, key)


def make_pki(root: Path) -> Pki:
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    other.cert_pem.write_to_path(str(root / "other-ca.pem"))
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    expired = {"not_before": past - dt.timedelta(days=30), "not_after": past}
    return Pki(
        root=root,
        ca=root / "ca.pem",
        other_ca=root / "other-ca.pem",
        server=_write(root, "server", ca.issue_cert("localhost", "127.0.0.1")),
        expired_server=_write(root, "expired-server",
                              ca.issue_cert("localhost", "127.0.0.1", **expired)),
        client_a=_write(root, "client-a", ca.issue_cert("edge-a.example")),
        client_b=_write(root, "client-b", ca.issue_cert("edge-b.example")),
        expired_client=_write(root, "expired-client", ca.issue_cert("edge-a.example", **expired)),
        rogue_client=_write(root, "rogue-client", other.issue_cert("edge-a.example")),
        _ca=ca,
    )


def server_security(pki: Pki, *, mtls: bool = False, token_file: Path | None = None,
                    leaf: Leaf | None = None, **kw: object) -> ServerSecurity:
    leaf = leaf or pki.server
    tls = ServerTls(leaf.cert, leaf.key, pki.ca, "require" if mtls else "none")
    return ServerSecurity(tls=tls, token_file=token_file, **kw)  # type: ignore[arg-type]


def client_security(pki: Pki, *, leaf: Leaf | None = None, token: str | None = None,
                    ca: Path | None = None) -> ClientSecurity:
    return ClientSecurity(
        tls=True, ca=ca or pki.ca, cert=leaf.cert if leaf else None,
        key=leaf.key if leaf else None, server_name="localhost", token=token,
    )


def write_tokens(path: Path, **tokens: str) -> Path:
    path.write_text("# name:token\n" + "".join(f"{k}:{v}\n" for k, v in tokens.items()))
    return path
