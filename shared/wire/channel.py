"""Client channels: plaintext or TLS (optionally mutual), and the bearer-token metadata."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpc import aio

from eventspec.shared.wire.security import ClientSecurity, SecurityConfigError
from eventspec.shared.wire.tls import channel_credentials, client_channel_options

Metadata = tuple[tuple[str, str], ...]


def open_channel(
    target: str, security: ClientSecurity | None, options: Sequence[tuple[str, Any]] = ()
) -> aio.Channel:
    """An ``aio`` channel to ``target``: TLS when ``security.tls``, else plaintext."""
    if security is None or not security.tls:
        return aio.insecure_channel(target, options=list(options))
    return aio.secure_channel(
        target, channel_credentials(security),
        options=list(options) + client_channel_options(security),
    )


def call_metadata(security: ClientSecurity | None) -> Metadata:
    """The ``authorization: Bearer`` header for every call, when a token is configured."""
    if security is None or not security.token:
        return ()
    return (("authorization", f"Bearer {security.token}"),)


def read_token(path: Path | None, inline: str | None, flag: str) -> str | None:
    """A client's bearer token: the file's content (one line), else ``inline`` (env)."""
    if path is not None:
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise SecurityConfigError(f"{flag} {path}: cannot read: {exc.strerror}") from exc
        if not token or any(c.isspace() for c in token):
            raise SecurityConfigError(f"{flag} {path}: expected one token on one line")
        return token
    return inline or None
