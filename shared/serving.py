"""Running a node's server from its CLI until SIGTERM/SIGINT, the same way on both nodes."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Protocol

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: ``--dtype`` spellings both nodes accept -> the torch dtype's name.
MODEL_DTYPES: dict[str, str] = {
    "float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}


class NodeServer(Protocol):
    """What ``VerifierServer`` and ``EdgeServer`` offer the CLI."""

    port: int

    async def start(self) -> int: ...

    async def stop(self, grace_s: float | None = None) -> None: ...


async def serve_until_signalled(
    server: NodeServer, port_file: Path | None, log: logging.Logger, grace_s: float
) -> None:
    """Start, write the bound port (for ``--port 0``), wait for a signal, stop gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    if port_file is not None:
        port_file.write_text(str(server.port))
    await stop.wait()
    log.info("shutting down (grace %.0f s)", grace_s)
    await server.stop()


def run_node(server: NodeServer, port_file: Path | None, log: logging.Logger,
             grace_s: float, name: str) -> int:
    """``asyncio.run`` the server; a failure is one clear log line and exit code 1."""
    try:
        asyncio.run(serve_until_signalled(server, port_file, log, grace_s))
    except Exception as exc:  # a clear one-line error for operators
        log.error("%s failed: %s", name, exc)
        return 1
    return 0
