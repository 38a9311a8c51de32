"""Usage and source errors of the node commands: one line, exit 2, before any model or
network work (issue 38, item 3).

Before: a missing file, an unknown kind or ``--host 0.0.0.0`` without TLS took 5 to 14 s
(torch imported, port bound, warm-up started) and exited 1; a busy port printed gRPC's
raw ``E1128 ... add_port.cc:83]`` line first. "Before any model work" is checked without
a clock: the command runs under ``python -X importtime``, and torch must not be among
the modules it imported before refusing.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventspec.shared.client.launch import entry_point_command
from tests.support.cli_processes import ROOT

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "real"
DAT = REAL / "dat_ncars_tonic_test_sample.dat"
PICKLED = REAL / "npy_eventgpt_samples_sample1.npy"
#: A user's environment: this test process set GRPC_VERBOSITY when it imported eventspec.
USER_ENV = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def run_traced(script: str, args: list[str]) -> tuple[subprocess.CompletedProcess[str],
                                                       list[str], set[str]]:
    """The command under ``-X importtime``: its result, its stderr lines other than the
    import trace, and the modules it imported."""
    cmd = entry_point_command(script, args)
    out = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env=USER_ENV)
    lines = out.stderr.strip().splitlines()
    modules = {ln.rsplit("|", 1)[1].strip() for ln in lines if ln.startswith("import time:")}
    said = [ln for ln in lines if not ln.startswith("import time:")]
    return out, said, modules


def assert_one_line_exit_2(out: subprocess.CompletedProcess[str], said: list[str],
                           *needles: str) -> None:
    assert out.returncode == 2, (out.returncode, said)
    assert len(said) == 1, said
    for needle in needles:
        assert needle in said[0], said[0]


@pytest.mark.parametrize(("args", "needles"), [
    (["--source", "/nope/x.dat"], ["--source: event file /nope/x.dat does not exist"]),
    (["--source", "foo:x.dat"], ["unknown event source 'foo:x.dat'"]),
    (["--source", "toy:x"], ["toy:x"]),
    (["--source", "dv-net:nohost"], ["dv-net needs HOST:PORT"]),
    (["--source", f"bin:{DAT}"], [f"{DAT} does not look like bin (it looks like dat"]),
    (["--source", str(PICKLED)], [str(PICKLED), "--allow-pickle"]),
    (["--host", "0.0.0.0", "--source", "toy"], ["refusing to serve plaintext", "0.0.0.0"]),
])
def test_edge_serve_refuses_before_any_model_work(args: list[str], needles: list[str]
                                                  ) -> None:
    if not REAL.is_dir() and any(str(REAL) in a for a in args):
        pytest.skip("real recordings not found")
    out, said, modules = run_traced("eventspec-edge", ["serve", "--model", "toy", *args])
    assert_one_line_exit_2(out, said, *needles)
    assert "torch" not in modules, "torch was imported before the refusal"


@pytest.mark.parametrize("flag", ["--port", "--health-port", "--metrics-port"])
def test_edge_serve_refuses_a_busy_port_without_grpc_lines(flag: str, busy_port: int) -> None:
    ports = {"--port": "0", flag: str(busy_port)}
    args = [a for f, p in ports.items() for a in (f, p)]
    out, said, modules = run_traced("eventspec-edge", ["serve", "--model", "toy", "--source",
                                                       "toy", *args])
    assert_one_line_exit_2(out, said, f"{flag} {busy_port}", "is in use")
    assert "torch" not in modules


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--port", "BUSY"]])
def test_cloud_serve_refuses_in_one_line(args: list[str], busy_port: int) -> None:
    """The cloud's refusals go through the same shared start (its settings module
    imports torch, so only the one line and the exit status are checked here)."""
    args = [str(busy_port) if a == "BUSY" else a for a in args]
    out, said, _ = run_traced("eventspec-cloud", ["serve", "--model", "toy", *args])
    assert_one_line_exit_2(out, said)
    assert "E1128" not in out.stderr and "add_port" not in out.stderr


def test_a_bind_failure_after_the_checks_prints_no_raw_grpc_line(busy_port: int,
                                                                 tmp_path: Path) -> None:
    """gRPC's C core stays quiet (GRPC_VERBOSITY, set when a node package is imported):
    a bind that fails inside gRPC still ends in the node's own line alone."""
    script = tmp_path / "bind.py"
    script.write_text(
        "import asyncio, eventspec.edge\n"
        "from eventspec.shared.wire.host import GrpcHost\n"
        "async def main():\n"
        "    host = GrpcHost('x', max_message_bytes=1 << 20, max_rpcs=4)\n"
        f"    await host.start('127.0.0.1', {busy_port})\n"
        "try:\n"
        "    asyncio.run(main())\n"
        "except Exception as exc:\n"
        "    print('refused:', exc)\n")
    out = subprocess.run([entry_point_command("eventspec-edge", [])[0], str(script)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env=USER_ENV)
    assert "refused:" in out.stdout, (out.stdout, out.stderr)
    assert "add_port" not in out.stderr, out.stderr


def truncated_pickled_npy(tmp_path: Path) -> Path:
    """An EventGPT-style .npy (a pickled dict of event columns) cut in half."""
    import numpy as np

    path = tmp_path / "cut.npy"
    n = 5000
    events = {"x": np.arange(n) % 64, "y": np.arange(n) % 48, "t": np.arange(n) * 10,
              "p": np.arange(n) % 2}
    np.save(path, np.array(events, dtype=object), allow_pickle=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize(("args", "needles"), [
    (["--model", "/nope/eventgpt"], ["--model", "/nope/eventgpt", "toy"]),
    (["--model", "toy", "--adapter", "/nope/adapter"], ["--adapter", "/nope/adapter"]),
    (["--model", "toy", "--draft-head", "/nope/head"], ["--draft-head", "/nope/head"]),
    (["--model", "toy", "--source", "TRUNCATED", "--allow-pickle"],
     ["cut.npy", "pickle", "truncated"]),
])
def test_edge_serve_refuses_missing_directories_and_a_cut_pickle_before_model_work(
        args: list[str], needles: list[str], tmp_path: Path) -> None:
    """Issue 38 item 3, the closing run's misses (benchmarks/results/reliability-cpu.json):
    a missing --model directory was found when the model loaded (exit 1 after 4.7 s, the
    port bound), and a truncated pickled .npy while the source opened in warm-up."""
    args = [str(truncated_pickled_npy(tmp_path)) if a == "TRUNCATED" else a for a in args]
    out, said, modules = run_traced("eventspec-edge", ["serve", *args])
    assert_one_line_exit_2(out, said, *needles)
    assert "torch" not in modules, "torch was imported before the refusal"


@pytest.mark.parametrize(("args", "needles"), [
    (["--host", "0.0.0.0"], ["refusing to serve plaintext"]),
    (["--port", "BUSY"], ["is in use"]),
    (["--max-sessions", "-3"], ["--max-sessions"]),
    (["--model", "/nope/video-llava"], ["--model", "/nope/video-llava"]),
])
def test_cloud_serve_refuses_before_torch(args: list[str], needles: list[str],
                                          busy_port: int) -> None:
    """The cloud's settings no longer import torch (they did through the step buckets and
    the chunk tiles: 1.7 s before the one line), and a missing --model directory is
    refused with them (it was exit 1 after 5 s, the port bound)."""
    args = [str(busy_port) if a == "BUSY" else a for a in args]
    out, said, modules = run_traced("eventspec-cloud", ["serve", *(
        args if "--model" in args else ["--model", "toy", *args])])
    assert_one_line_exit_2(out, said, *needles)
    assert "torch" not in modules, "torch was imported before the refusal"


@pytest.mark.parametrize("args", [["demo", "--runs", "0"], ["demo", "--nope"],
                                  ["toy", "eval", "--nope"], ["toy"]])
def test_demo_and_toy_argument_errors_are_one_line(args: list[str]) -> None:
    """They printed argparse's usage block above the error (8 and 2 lines in the closing
    run); now one line, as every other ``eventspec`` command."""
    out, said, _ = run_traced("eventspec", args)
    assert_one_line_exit_2(out, said, "error:")
