"""Client commands at the edges (issue 38, item 6): a TLS mismatch says how to fix it,
and a closed stdout ends every command quietly with 141, as ``ask`` did.

Before: a plaintext ``eventspec ask``/``status`` at a TLS edge said only "Socket closed";
``eventspec status | head`` and ``eventspec demo | head`` ended in BrokenPipeError
tracebacks with exit 1. A closed stdout is made deterministic here: the command's stdout
is a pipe whose read end is already closed, so its first write fails.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from eventspec.edge.config import EdgeSettings
from eventspec.edge.server import EdgeServer
from eventspec.shared.client.launch import entry_point_command
from tests.support.cli_processes import ROOT
from tests.support.edge_harness import shared_models
from tests.support.tls_harness import make_pki, server_security

#: gRPC's C core writing to stderr itself ("I1128 04:45:28.717914 3224 ssl_transport...").
RAW_GRPC_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d", re.M)


async def run(args: list[str], *, closed_stdout: bool = False,
              timeout: float = 120) -> tuple[int, str]:
    """``eventspec ARGS`` as a process; (exit status, stderr)."""
    stdout: int = asyncio.subprocess.DEVNULL
    read_end = write_end = -1
    if closed_stdout:
        read_end, write_end = os.pipe()
        os.close(read_end)
        stdout = write_end
    try:
        # As a user's shell: this process set GRPC_VERBOSITY when it imported the edge.
        env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
        proc = await asyncio.create_subprocess_exec(
            *entry_point_command("eventspec", args), cwd=ROOT, stdout=stdout,
            stderr=asyncio.subprocess.PIPE, env=env)
    finally:
        if write_end >= 0:
            os.close(write_end)
    _, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@asynccontextmanager
async def edge(**settings: object) -> AsyncIterator[int]:
    _, draft = shared_models()
    server = EdgeServer(replace(EdgeSettings(), cloud=None, port=0, **settings),  # type: ignore[arg-type]
                        draft=draft)
    await server.start()
    try:
        yield server.port
    finally:
        await server.stop(0)


async def test_plaintext_at_a_tls_edge_is_told_to_add_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    async with edge(security=server_security(pki)) as port:
        for args in (["ask", "--edge", f"127.0.0.1:{port}", "--mode", "draft_only", "What?"],
                     ["status", f"127.0.0.1:{port}"]):
            code, err = await run(args)
            assert code == 1, (args, err)
            assert "Socket closed" in err and "hint: " in err and "add --tls" in err, err
            assert not RAW_GRPC_LINE.search(err), err


async def test_tls_at_a_plaintext_edge_is_told_to_drop_it(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    async with edge() as port:
        for args in (["ask", "--edge", f"127.0.0.1:{port}", "--mode", "draft_only", "What?"],
                     ["status", f"127.0.0.1:{port}"]):
            code, err = await run([*args, "--tls-ca", str(pki.ca)])
            assert code == 1, (args, err)
            assert "speaks plaintext, not TLS: drop --tls/--tls-ca" in err, err
            assert not RAW_GRPC_LINE.search(err), err


@pytest.mark.parametrize("json", [False, True])
async def test_status_into_a_closed_pipe_ends_quietly(json: bool) -> None:
    async with edge() as port:
        code, err = await run(["status", f"127.0.0.1:{port}", *(["--json"] if json else [])],
                              closed_stdout=True)
    assert code == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


async def test_demo_into_a_closed_pipe_ends_quietly() -> None:
    code, err = await run(["demo", "--runs", "1"], closed_stdout=True, timeout=300)
    assert code == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
