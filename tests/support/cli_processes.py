"""The user's commands as processes: start a node by its console entry point, wait for its
port and its warm line, and run ``eventspec ask --json``."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from eventspec.shared.client.launch import entry_point_command

ROOT = Path(__file__).resolve().parents[2]

#: ``eventspec-cloud serve`` flags for a test that needs a cloud process SERVING quickly:
#: a paced engine plans with the costs it is paced to (``GetServerInfo`` labels them
#: "paced engine, known costs") and is not calibrated. The other ways to start without
#: measuring do not hold on a busy 2-core machine: calibrating the toy target took 30 s
#: to 3 min there, and a saved ``--profile`` is spot-checked against a few real steps,
#: which a busy moment puts off by more than the 2x it tolerates, and then it calibrates.
#: The paces are above what the toy and tiny-random models take on an idle CPU.
PACED_CLOUD = ("--emulate-prefill-ms", "50", "--emulate-step-ms", "10")


def spawn(script: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "wb") as f:
        return subprocess.Popen(entry_point_command(script, args), cwd=ROOT, stdout=f,
                                stderr=subprocess.STDOUT, env=env)


#: The last line a node logs once warm (the port file is written at bind time, before).
WARM_LINES = ("verifier SERVING", "edge agent warm on")


def wait_port(proc: subprocess.Popen[bytes], port_file: Path, log: Path,
              timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {log.read_text()[-2000:]}")
        text = log.read_text(errors="replace") if log.exists() else ""
        if port_file.exists() and port_file.read_text() and any(w in text for w in WARM_LINES):
            return int(port_file.read_text())
        time.sleep(0.1)
    raise AssertionError(f"no port or not warm: {log.read_text()[-2000:]}")


def ask_json(edge: int, mode: str, question: str, *extra: str) -> dict:
    out = subprocess.run(
        entry_point_command("eventspec", ["ask", "--edge", f"127.0.0.1:{edge}", "--mode", mode,
                                          "--json", "--max-new-tokens", "12", *extra, question]),
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
