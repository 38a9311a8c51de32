"""Loopback ports for tests that need "nothing answers there"."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections and that no server can take while held.

    The socket is bound and never listens: a connection gets ECONNREFUSED, and a server
    asking for port 0 cannot be handed this port. A port bound and closed at once (the
    old helper) could be: under load an edge under test was given its own "dead cloud"
    port and dialled itself (``not an eventspec Verifier (UNIMPLEMENTED)``).
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])
