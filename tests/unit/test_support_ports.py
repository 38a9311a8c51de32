"""The "dead cloud" port of the tests stays dead: refused, and never handed to a server."""

from __future__ import annotations

import errno
import socket

import pytest
from grpc import aio

from tests.support.ports import refusing_port


def test_a_refusing_port_refuses_connections() -> None:
    with refusing_port() as port, socket.socket() as client:
        client.settimeout(5)
        with pytest.raises(ConnectionRefusedError) as err:
            client.connect(("127.0.0.1", port))
        assert err.value.errno == errno.ECONNREFUSED


async def test_no_server_can_take_a_refusing_port_while_it_is_held() -> None:
    """gRPC binds with SO_REUSEPORT; the held socket does not, so the bind must fail
    (a port merely bound and closed would be taken: the flake this guards against)."""
    with refusing_port() as port:
        server = aio.server()
        try:
            with pytest.raises(RuntimeError):
                bound = server.add_insecure_port(f"127.0.0.1:{port}")
                if bound == 0:
                    raise RuntimeError("not bound")
        finally:
            await server.stop(None)
