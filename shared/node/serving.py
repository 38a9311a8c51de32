"""Running a node's server from its CLI until SIGTERM/SIGINT, the same way on both nodes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Any, Protocol

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: ``--dtype`` spellings both nodes accept -> the torch dtype's name.
MODEL_DTYPES: dict[str, str] = {
    "float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}


def quiet_progress_bars() -> None:
    """No tqdm bars in a node's log ("Loading weights: 100%|████|" on every start): a
    log is read line by line, and the loader's own INFO line says what was loaded."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def torch_dtype(name: str) -> Any:
    """The torch dtype ``--dtype name`` means (one of :data:`MODEL_DTYPES`); imports torch."""
    import torch

    return getattr(torch, MODEL_DTYPES[name])


class NodeServer(Protocol):
    """What ``VerifierServer`` and ``EdgeServer`` offer the CLI."""

    port: int

    async def start(self, *, warm: bool = True) -> int: ...

    async def warm_up(self) -> None: ...

    async def stop(self, grace_s: float | None = None) -> None: ...


async def warm_or_stop(server: NodeServer, warm: bool) -> int:
    """The end of a node's ``start``: warm up when ``warm`` (a failed or cancelled
    warm-up stops the server at once, no grace), then the bound port."""
    if warm:
        try:
            await server.warm_up()
        except BaseException:
            await server.stop(0)
            raise
    return server.port


async def serve_until_signalled(
    server: NodeServer, port_file: Path | None, log: logging.Logger, grace_s: float
) -> None:
    """Bind, write the bound port (for ``--port 0``) at once, warm up, wait for a signal,
    stop gracefully.

    The port is written before warm-up (loading models, calibrating) because the server
    answers from then on: health says NOT_SERVING and why, and a client waits with
    ``eventspec wait HOST:PORT``. A signal during warm-up stops the server too.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start(warm=False)
    if port_file is not None:
        port_file.write_text(str(server.port))
    warming = asyncio.ensure_future(server.warm_up())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((warming, stopping), return_when=asyncio.FIRST_COMPLETED)
        if warming.done():
            warming.result()  # a failed warm-up fails the node
        else:
            log.info("stopped while warming up")
            warming.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await warming
    except BaseException:
        stopping.cancel()
        await server.stop(0)
        raise
    await stopping
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
