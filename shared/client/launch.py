"""Starting the nodes as processes, through their console entry points.

The demo, ``eventspec toy eval`` and the tests start a cloud or an edge the way a user
does: ``eventspec-cloud ...`` / ``eventspec-edge ...``. This module is the one place
that knows how. It runs the entry point's function with the current interpreter
(``python -c "from eventspec.cloud.cli import main; ..."``) rather than looking for the script on
PATH, so it starts the code of the environment (and checkout) it runs in, installed or
not. :data:`ENTRY_POINTS` mirrors ``[project.scripts]`` in ``pyproject.toml``; a test
keeps the two equal.

No node is imported here: the nodes run in their own processes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

Node = Literal["eventspec-cloud", "eventspec-edge"]

#: Console script -> ``module:function``, as in ``[project.scripts]``.
ENTRY_POINTS: dict[str, str] = {
    "eventspec": "eventspec.shared.client.cli:main",
    "eventspec-cloud": "eventspec.cloud.cli:main",
    "eventspec-edge": "eventspec.edge.cli:main",
}


def entry_point_command(script: str, args: Sequence[str]) -> list[str]:
    """The argv that runs console script ``script`` with ``args`` in this interpreter."""
    module, _, function = ENTRY_POINTS[script].partition(":")
    code = f"import sys; from {module} import {function}; sys.exit({function}())"
    return [sys.executable, "-c", code, *args]


def start_node(node: Node, args: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``node`` with ``args``; its stdout and stderr go to ``log_path``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(entry_point_command(node, args), stdout=log_file,
                                stderr=subprocess.STDOUT, env=env)


async def wait_for_port(proc: subprocess.Popen[bytes], port_file: Path, log_path: Path,
                        timeout_s: float) -> int:
    """The port a node started with ``--port 0 --port-file F`` bound, once it writes it
    (at bind time, before warm-up: ``wait_for_serving`` waits for the node to be warm).

    Raises RuntimeError (with the log's tail) if the node exits first, TimeoutError if
    it writes no port in time.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"process exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            )
        if port_file.exists() and port_file.read_text().strip():
            return int(port_file.read_text())
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no port after {timeout_s:.0f} s:\n{log_path.read_text()[-3000:]}")


def stop_node(proc: subprocess.Popen[bytes] | None, timeout_s: float = 15.0) -> None:
    """SIGTERM (a graceful stop), then SIGKILL if it has not exited in ``timeout_s``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
