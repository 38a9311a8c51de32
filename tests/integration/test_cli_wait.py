"""``eventspec wait`` gives up on faults that waiting cannot cure (issue 38, item 4).

Before, it waited its whole ``--timeout`` (600 s) against a port where nothing listens,
an HTTP server, a TLS mismatch, or an edge whose ``--cloud`` is another edge. Now it
says why and exits 3 at once (nothing listening: after its connect budget, unless
``--retry-refused``); in a terminal it shows a live counter.

The command runs as a process (``asyncio`` subprocess, so the servers in this test's
loop keep answering while it runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from eventspec.edge.config import EdgeSettings
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.launch import entry_point_command
from eventspec.shared.wire.health import NeverServing, wait_for_serving
from eventspec.shared.wire.host import GrpcHost
from tests.support.cli_processes import ROOT
from tests.support.edge_harness import shared_models
from tests.support.ports import refusing_port
from tests.support.tls_harness import TOKEN_A, make_pki, server_security, write_tokens


async def wait_cmd(*args: str, timeout: float = 60) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *entry_point_command("eventspec", ["wait", *args]), cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@contextlib.asynccontextmanager
async def bare_host(**kw: object) -> AsyncIterator[int]:
    """A gRPC server with health (SERVING) and no eventspec service."""
    host = GrpcHost("not.eventspec.Thing", max_message_bytes=1 << 20, max_rpcs=8,
                    **kw)  # type: ignore[arg-type]
    port = await host.start("127.0.0.1", 0)
    await host.set_serving(True)
    try:
        yield port
    finally:
        await host.stop(0)


@contextlib.contextmanager
def http_server() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", (
        "import http.server, sys\n"
        "s = http.server.HTTPServer(('127.0.0.1', 0), http.server.BaseHTTPRequestHandler)\n"
        "print(s.server_address[1], flush=True)\n"
        "s.serve_forever()\n")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


async def test_an_http_server_is_not_waited_for() -> None:
    with http_server() as port:
        code, err = await wait_cmd(f"127.0.0.1:{port}")
    assert code == 3, err
    assert "not a gRPC server" in err, err


async def test_a_grpc_server_that_is_not_an_eventspec_node_is_not_waited_for() -> None:
    async with bare_host() as port:
        code, err = await wait_cmd(f"127.0.0.1:{port}")
    assert code == 3, err
    assert "serves neither an eventspec Verifier nor an EdgeAgent" in err, err


async def test_tls_mismatches_and_a_refused_token_are_not_waited_for(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    async with bare_host() as plain:
        code, err = await wait_cmd(f"127.0.0.1:{plain}", "--tls-ca", str(pki.ca))
    assert code == 3 and "speaks plaintext, not TLS: drop --tls" in err, err
    tokens = write_tokens(tmp_path / "tokens", client=TOKEN_A)
    _, draft = shared_models()
    edge = EdgeServer(replace(EdgeSettings(), cloud=None, port=0,
                              security=server_security(pki, token_file=tokens)), draft=draft)
    await edge.start()
    try:
        code, err = await wait_cmd(f"127.0.0.1:{edge.port}", "--tls-ca", str(pki.other_ca))
        assert code == 3 and "--tls-ca with the CA that signed it" in err, err
        (tmp_path / "wrong").write_text("not-the-token-0123456789abcdef0123456789")
        code, err = await wait_cmd(f"127.0.0.1:{edge.port}", "--tls-ca", str(pki.ca),
                                   "--tls-server-name", "localhost",
                                   "--token-file", str(tmp_path / "wrong"))
        assert code == 3 and "refused this client's token" in err, err
        (tmp_path / "right").write_text(TOKEN_A)
        code, err = await wait_cmd(f"127.0.0.1:{edge.port}", "--tls-ca", str(pki.ca),
                                   "--tls-server-name", "localhost",
                                   "--token-file", str(tmp_path / "right"))
        assert code == 0, err
    finally:
        await edge.stop(0)


async def test_an_edge_whose_cloud_is_another_edge_is_not_waited_for() -> None:
    _, draft = shared_models()
    other = EdgeServer(replace(EdgeSettings(), cloud=None, port=0), draft=draft)
    await other.start()
    edge = EdgeServer(replace(EdgeSettings(), cloud=f"127.0.0.1:{other.port}", port=0),
                      draft=draft)
    await edge.start()
    try:
        code, err = await wait_cmd(f"127.0.0.1:{edge.port}")
    finally:
        await edge.stop(0)
        await other.stop(0)
    assert code == 3, err
    assert "not an eventspec Verifier" in err and "--cloud" in err, err


async def test_nothing_listening_ends_after_the_connect_budget_unless_retried() -> None:
    """The budget's logic in-process with 1 s (the command's is 30 s)."""
    with refusing_port() as port:
        with pytest.raises(NeverServing, match=r"nothing answered for \d+ s: nothing listens"):
            await wait_for_serving(f"127.0.0.1:{port}", timeout_s=600, connect_budget_s=1.0)
        with pytest.raises(TimeoutError):  # --retry-refused: no budget, the timeout ends it
            await wait_for_serving(f"127.0.0.1:{port}", timeout_s=1.5, connect_budget_s=None)


def test_a_terminal_sees_a_live_counter() -> None:
    """In a terminal, stderr carries a line rewritten in place with the seconds waited."""
    with refusing_port() as port:
        leader, follower = pty.openpty()
        try:
            proc = subprocess.Popen(
                entry_point_command("eventspec", ["wait", f"127.0.0.1:{port}", "--timeout", "2",
                                                  "--retry-refused"]),
                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=follower)
            os.close(follower)
            chunks = []
            with contextlib.suppress(OSError):  # EIO once the process has closed the pty
                while chunk := os.read(leader, 4096):
                    chunks.append(chunk)
            assert proc.wait(60) == 1
        finally:
            os.close(leader)
    text = b"".join(chunks).decode(errors="replace")
    assert "\r  waiting 1 s: unreachable: nothing listens" in text, text
    assert "did not report SERVING within 2 s" in text, text
