"""Who is calling: the authenticated principal of the current RPC, transport-neutral.

The server's auth interceptor sets it for the duration of each call; domain code (for
example a per-principal session limit in a registry) reads it with ``current_principal``
without importing grpc. Tasks created inside a handler inherit it (contextvars).
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

#: The principal of a call on a server that requires no authentication (loopback dev mode).
ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    ``name`` is the token's name (``token``) or the client certificate's first SAN
    (``certificate``); ``ANONYMOUS`` with ``method`` ``none`` when auth is off.
    """

    name: str
    method: str  # "token" | "certificate" | "none"

    def __str__(self) -> str:
        return f"{self.method}:{self.name}"


ANONYMOUS_PRINCIPAL = Principal(ANONYMOUS, "none")

_CURRENT: contextvars.ContextVar[Principal] = contextvars.ContextVar(
    "eventspec_principal", default=ANONYMOUS_PRINCIPAL
)


def current_principal() -> Principal:
    """The principal of the RPC this code runs in (``ANONYMOUS_PRINCIPAL`` outside one)."""
    return _CURRENT.get()


def set_principal(principal: Principal) -> contextvars.Token[Principal]:
    """Bind ``principal`` to the current context; the auth interceptor calls this."""
    return _CURRENT.set(principal)
