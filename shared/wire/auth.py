"""Authentication and authorisation of callers, as a server interceptor.

A caller proves who it is with a bearer token (``authorization: Bearer TOKEN``
metadata: the scheme in any case, the token exactly as sent, see ``_bearer_token``;
checked in constant time against named tokens) or, on a mutual-TLS port, with its
client certificate, whose first subject alternative name is the principal.
Authenticated principals outside ``allow_principals`` (when that is set) are refused.

- no or a wrong credential: UNAUTHENTICATED; a principal not allowed: PERMISSION_DENIED;
  both are logged with the method, peer and principal, never the token.
- the health service stays open so load balancers and Kubernetes probes work;
  reflection and every other service sit behind the same check.
- the principal is bound to ``eventspec.shared.contract.principal`` for the duration of the call, so
  per-principal limits can be enforced by domain code without grpc.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from eventspec.shared.contract.principal import Principal, set_principal
from eventspec.shared.wire.handlers import MethodInterceptor, wrap_handler
from eventspec.shared.wire.refusals import mark_refused
from eventspec.shared.wire.security import SecurityConfigError, ServerSecurity

log = logging.getLogger(__name__)

#: Methods that never require credentials: probes must work without secrets.
OPEN_METHODS = frozenset({
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
})
MIN_TOKEN_CHARS = 16
_NAME = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")


def parse_tokens(lines: Sequence[str], where: str) -> dict[str, str]:
    """``NAME:TOKEN`` entries (blank lines and ``#`` comments skipped) -> {name: token}.

    Errors name ``where`` and the line, never the token itself.
    """
    tokens: dict[str, str] = {}
    for i, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, token = line.partition(":")
        name, token = name.strip(), token.strip()
        if not sep or not _NAME.match(name):
            raise SecurityConfigError(
                f"{where}, entry {i}: expected NAME:TOKEN with NAME of letters, digits, '._@-'"
            )
        if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
            raise SecurityConfigError(
                f"{where}, entry {i} ({name}): the token must be at least {MIN_TOKEN_CHARS} "
                "characters without spaces (e.g. openssl rand -hex 32)"
            )
        if name in tokens:
            raise SecurityConfigError(f"{where}, entry {i}: token name {name!r} appears twice")
        tokens[name] = token
    return tokens


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file is rewritten, replaced or removed (None: it is gone).

    Size and inode next to the modification time catch a rewrite within the same clock
    tick and an atomic replace (``mv new tokens``) that keeps the old time.
    """
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class TokenStore:
    """Named bearer tokens; a token file is re-read when it changes (rotation).

    Removing the file or emptying it revokes every token it held: a deleted credential
    must stop working, so the store does not keep serving what it loaded before (the
    inline tokens, from the environment, stay). A file that does not parse keeps the
    previous tokens, logged as an error: a typo in one line must not lock every caller
    out. At start-up both are errors.
    """

    def __init__(self, file: Path | None, inline: Sequence[tuple[str, str]] = ()) -> None:
        self._file = file
        self._inline = dict(inline)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._digests: list[tuple[str, bytes]] = []
        self._load()

    def _load(self) -> None:
        tokens = dict(self._inline)
        if self._file is not None:
            self._stamp = _stamp(self._file)
            try:
                text = self._file.read_text()
            except OSError as exc:
                raise SecurityConfigError(
                    f"--token-file {self._file}: cannot read: {exc.strerror}"
                ) from exc
            tokens.update(parse_tokens(text.splitlines(), f"--token-file {self._file}"))
        if not tokens:
            raise SecurityConfigError("no tokens configured: the token file is empty")
        self._digests = [(name, _digest(tok)) for name, tok in tokens.items()]

    def _revoke_file_tokens(self, why: str) -> None:
        """Keep only the inline tokens (none at all: every bearer token is refused)."""
        self._digests = [(name, _digest(tok)) for name, tok in self._inline.items()]
        log.warning("--token-file %s %s: its tokens are revoked (%d inline tokens remain)",
                    self._file, why, len(self._digests))

    def _maybe_reload(self) -> None:
        if self._file is None:
            return
        stamp = _stamp(self._file)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        if stamp is None:
            self._revoke_file_tokens("was removed")
            return
        try:
            text = self._file.read_text()
            file_tokens = parse_tokens(text.splitlines(), f"--token-file {self._file}")
        except OSError as exc:
            self._revoke_file_tokens(f"cannot be read ({exc.strerror})")
            return
        except SecurityConfigError as exc:
            log.error("token reload failed, keeping the previous tokens: %s", exc)
            return
        if not file_tokens:
            self._revoke_file_tokens("is empty")
            return
        tokens = {**self._inline, **file_tokens}
        self._digests = [(name, _digest(tok)) for name, tok in tokens.items()]
        log.info("tokens reloaded from %s (%d names)", self._file, len(self._digests))

    def match(self, presented: str) -> str | None:
        """The name of the token equal to ``presented``, compared in constant time."""
        with self._lock:
            self._maybe_reload()
            digests = list(self._digests)
        want = _digest(presented)
        found: str | None = None
        for name, digest in digests:  # no early exit: time does not depend on which matched
            if hmac.compare_digest(want, digest):
                found = name
        return found


def _certificate_principal(context: aio.ServicerContext[Any, Any]) -> str | None:
    auth = context.auth_context()
    if auth.get("transport_security_type") != [b"ssl"]:
        return None
    sans = auth.get("x509_subject_alternative_name") or []
    if sans:
        return str(sans[0].decode(errors="replace"))
    cn = auth.get("x509_common_name") or []
    return str(cn[0].decode(errors="replace")) if cn else None


class _Denied(Exception):
    def __init__(self, code: grpc.StatusCode, reason: str, principal: str = "-") -> None:
        super().__init__(reason)
        self.code, self.reason, self.principal = code, reason, principal


def _bearer_token(header: str, principal: str = "-") -> str:
    """The token of an ``authorization`` value, exactly as sent; ``_Denied`` if it is none.

    The grammar is RFC 6750's (section 2.1), ``"Bearer" 1*SP b64token``, within RFC 7235's
    ``credentials = auth-scheme [ 1*SP ( token68 / #auth-param ) ]``:

    - the scheme is case-insensitive (RFC 7235 section 2.1: "It uses a case-insensitive
      token as a means to identify the authentication scheme"), so ``bearer`` and
      ``BEARER`` are accepted;
    - one or more spaces separate it from the token (``1*SP``);
    - the token is everything after them, compared exactly as sent, never stripped: a
      b64token has no whitespace, nor may a token here (``parse_tokens``), and an HTTP/2
      field value must not end in whitespace (RFC 9113 section 8.2.1), though gRPC
      passes one through. A value with whitespace after or inside the token is
      UNAUTHENTICATED with a message that says so: stripping would accept credentials
      the grammar refuses, so what the server accepts would differ from what a proxy
      rule or log matching the header sees, and a client with a stray space would never
      learn that its header is malformed.

    ``principal`` is who a refusal is logged as (a certificate's name, or ``-``).
    """
    scheme, _, rest = header.partition(" ")
    token = rest.lstrip(" ")
    if scheme.lower() != "bearer" or not token:
        raise _Denied(grpc.StatusCode.UNAUTHENTICATED,
                      "the authorization metadata must be 'Bearer TOKEN'", principal)
    if any(c.isspace() for c in token):
        raise _Denied(grpc.StatusCode.UNAUTHENTICATED,
                      "the authorization metadata has whitespace after or inside the bearer "
                      "token: tokens are compared exactly as sent, so send 'Bearer TOKEN' "
                      "with nothing after the token", principal)
    return token


class AuthInterceptor(MethodInterceptor):
    """Refuse calls without valid credentials; bind the caller's principal."""

    def __init__(self, security: ServerSecurity) -> None:
        self.security = security
        self.tokens = (
            TokenStore(security.token_file, security.tokens)
            if security.token_file or security.tokens else None
        )
        self.require_cert = security.tls is not None and security.tls.client_auth == "require"
        #: Called with the status name of each refused call (the nodes' metrics).
        self.on_denied: Callable[[str], None] | None = None

    def authenticate(self, metadata: Sequence[tuple[str, Any]],
                     context: aio.ServicerContext[Any, Any]) -> Principal:
        """The caller's principal, or ``_Denied`` saying why not."""
        header = next((str(v) for k, v in metadata if k == "authorization"), None)
        cert_name = _certificate_principal(context) if self.require_cert else None
        if header is not None and self.tokens is not None:
            token = _bearer_token(header, cert_name or "-")
            name = self.tokens.match(token)
            if name is None:
                raise _Denied(grpc.StatusCode.UNAUTHENTICATED, "the bearer token is not valid",
                              cert_name or "-")
            principal = Principal(name, "token")
        elif cert_name is not None:
            principal = Principal(cert_name, "certificate")
        else:
            raise _Denied(grpc.StatusCode.UNAUTHENTICATED,
                          "credentials required: send 'authorization: Bearer TOKEN' metadata"
                          + (" or a client certificate" if self.require_cert else ""))
        allowed = self.security.allow_principals
        if allowed and principal.name not in allowed:
            raise _Denied(grpc.StatusCode.PERMISSION_DENIED,
                          f"principal {principal.name!r} is not allowed to call this service",
                          str(principal))
        return principal

    def wrap(self, handler: grpc.RpcMethodHandler,
             call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = call.method
        if method in OPEN_METHODS:
            return handler
        metadata = tuple(call.invocation_metadata or ())

        @contextlib.asynccontextmanager
        async def guard(context: aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
            try:
                principal = self.authenticate(metadata, context)
            except _Denied as denied:
                log.warning("%s %s from %s (principal %s): %s", denied.code.name, method,
                            context.peer(), denied.principal, denied.reason)
                if self.on_denied is not None:
                    self.on_denied(denied.code.name)
                mark_refused()
                await context.abort(denied.code, denied.reason)
            token = set_principal(principal)
            try:
                yield
            finally:
                with contextlib.suppress(ValueError):  # a generator closed in another context
                    token.var.reset(token)

        return wrap_handler(handler, guard)

